"""One settings object per process, built at its entry point, then passed down.

A process's entry point (a service's ``main``, a launcher command, a context entered in a
user script, a public function that keeps PERSIA's signature) builds its frozen
:class:`~pyrsia.shared.settings.Settings` from the environment; flags lie over it in the same
object; every other module takes the settings, or the values they yield, from its caller.
The guards read each file with ``ast``, so a call inside a function counts.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pyrsia.shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


def _library_files() -> list[Path]:
    return sorted([*(ROOT / "persia").rglob("*.py"), *(ROOT / "pyrsia").rglob("*.py")])


SETTINGS_BUILDERS = {
    "pyrsia/shared/redis_local.py": "`python -m pyrsia.shared.redis_local`'s main",
    "pyrsia/services/embedding_ps/main.py": "the PS's main",
    "pyrsia/services/embedding_worker/main.py": "the embedding worker's main",
    "pyrsia/services/nn_worker/launch.py": "`persia-launcher nn-worker`'s main",
    "pyrsia/services/nn_worker/rank_entry.py": "each NN-worker rank's main",
    "pyrsia/services/data_loader/launch.py": "`persia-launcher data-loader`'s main",
    "persia/_launch/run.py": "`persia-launcher run`'s main",
    "persia/_launch/serve.py": "`persia-launcher serve`'s main",
    "persia/_launch/status.py": "`persia-launcher status`'s main",
    "persia/_launch/prometheus.py": "`persia-launcher prometheus-targets`'s main",
    "persia/hb/run.py": "`python -m persia.hb.run`'s main",
    "persia/_base_ctx.py": "PERSIA's contexts (TrainCtx, EmbeddingCtx, InferCtx): entered, or "
    "connecting outside `with` as PERSIA's do",
    "persia/_data_ctx.py": "PERSIA's DataCtx, entered",
    "persia/helper.py": "PERSIA's PersiaServiceCtx, entered",
    "persia/prelude.py": "PERSIA's PersiaCommonContext, connecting when built alone",
    "persia/service.py": "PERSIA's get_embedding_worker_services(), read when called",
    "persia/logger.py": "PERSIA's get_logger()/get_default_logger(): LOG_LEVEL when called",
    "persia/epl/config.py": "EPL's Config(param_dict): EPL_* variables when built",
    "persia/hb/_context.py": "HybridBackend's hb.context: read when asked, as persia.env is",
    "persia/hb/_options.py": "HybridBackend's Options.reload_env(): HB_* variables when called",
    "persia/serving/artifact.py": "export_model()/load_model(): the config files' strictness",
}
"""The modules that build a process's :class:`Settings` from its environment (``current()``
or ``Settings.from_env()``): each a process's entry point or a public API that keeps its
signature (PERSIA's, EPL's, HybridBackend's), with the reason. Every other module gets the
settings, or the values they yield, from its caller."""
_ALLOWED_NAMESPACE_TAKERS = {"from_flags", "from_replica_flags", "flag_settings"}
"""The builders that turn parsed flags into a frozen options object at an entry point."""


def settings_builds(source: str) -> list[int]:
    """Lines of ``source`` that build settings from this process's environment: a call of
    ``pyrsia.shared.settings.current`` (however imported) or ``Settings.from_env()`` with
    no mapping."""
    tree = ast.parse(source)
    currents, modules, classes = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pyrsia.shared.settings":
            for alias in node.names:
                bound = alias.asname or alias.name
                if alias.name == "current":
                    currents.add(bound)
                elif alias.name == "Settings":
                    classes.add(bound)
        elif isinstance(node, ast.ImportFrom) and node.module == "pyrsia.shared":
            modules.update(a.asname or a.name for a in node.names if a.name == "settings")
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name == "pyrsia.shared.settings")
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in currents:
            lines.append(node.lineno)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if func.attr == "current" and owner in modules:
                lines.append(node.lineno)
            elif func.attr == "from_env" and owner in classes and not node.args:
                if not node.keywords:
                    lines.append(node.lineno)
    return sorted(lines)


def test_only_entry_points_build_settings() -> None:
    offenders = []
    for path in _library_files():
        name = path.relative_to(ROOT).as_posix()
        if name not in SETTINGS_BUILDERS:
            offenders += [f"{name}:{line}" for line in settings_builds(path.read_text())]
    assert not offenders, (
        "take a Settings (or the value it yields) from the caller; only an entry point "
        "(SETTINGS_BUILDERS, with the reason) builds one from the environment:\n"
        + "\n".join(offenders)
    )


def test_the_settings_builders_exist() -> None:
    for name in SETTINGS_BUILDERS:
        assert settings_builds((ROOT / name).read_text()), f"{name} no longer builds settings"


@pytest.mark.parametrize(
    "source",
    [
        "from pyrsia.shared.settings import current\nx = current().job_id\n",
        "def f():\n    from pyrsia.shared.settings import current as c\n    return c()\n",
        "from pyrsia.shared import settings\ns = settings.current()\n",
        "import pyrsia.shared.settings as ps\ns = ps.current()\n",
        "from pyrsia.shared.settings import Settings\ns = Settings.from_env()\n",
    ],
)
def test_the_settings_guard_sees_every_form(source: str) -> None:
    assert settings_builds(source)


def test_the_settings_guard_leaves_passed_settings_alone() -> None:
    source = (
        "from pyrsia.shared.settings import Settings\n"
        "def f(settings: Settings):\n    return Settings.from_env({'A': '1'}), settings.job_id\n"
    )
    assert not settings_builds(source)


def namespace_takers(source: str) -> list[tuple[int, str]]:
    """(line, name) of each function with a parameter annotated ``argparse.Namespace``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                if arg.annotation is not None and "Namespace" in ast.unparse(arg.annotation):
                    found.append((node.lineno, node.name))
                    break
    return found


def test_no_function_below_an_entry_point_takes_a_namespace() -> None:
    """Flags become a frozen options object at the entry point (``from_flags``); nothing
    below it takes the parsed ``argparse.Namespace``."""
    offenders = []
    for path in _library_files():
        name = path.relative_to(ROOT).as_posix()
        for line, function in namespace_takers(path.read_text()):
            if function not in _ALLOWED_NAMESPACE_TAKERS:
                offenders.append(f"{name}:{line} {function}")
    assert not offenders, "pass the entry point's options object instead:\n" + "\n".join(offenders)


def test_flags_lie_over_the_environment_in_one_settings_object() -> None:
    from pyrsia.services.embedding_ps.main import build_parser
    from pyrsia.shared.cli import ServerOptions

    environ = {"PYRSIA_BODY_TIMEOUT_S": "9", "PERSIA_BIND_HOST": "127.0.0.2"}
    args = build_parser().parse_args(["--body-timeout-s", "2.5", "--replica-index", "0"])
    options = ServerOptions.from_replica_flags(args, Settings.from_env(environ))
    assert options.settings.text("PYRSIA_BODY_TIMEOUT_S") == "2.5"  # the flag wins
    assert options.host == "127.0.0.2"  # $PERSIA_BIND_HOST, no --host
    assert options.max_request_bytes == 1 << 30
    assert Settings.from_env(environ).with_values({"A": "1"}).text("A") == "1"
