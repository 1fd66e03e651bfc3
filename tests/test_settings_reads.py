"""The environment is read in three library modules only, and their values are validated.

``pyrsia.shared.settings`` builds each process's frozen :class:`Settings` from the
environment, ``persia.env`` keeps PERSIA's rank and replica getters, and
``pyrsia.shared.process_env`` writes what child processes inherit. Every other module gets
its values from its caller. The guard reads each file with ``ast``, so a read inside a
function counts as much as one at the top.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pyrsia.shared.errors import ConfigError, RegistryError
from pyrsia.shared.registry_settings import RegistrySettings, wait_timeout_s
from pyrsia.shared.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
ENV_READERS = {
    "pyrsia/shared/settings.py": "builds the frozen Settings from the environment",
    "persia/env.py": "PERSIA's public rank and replica getters",
    "pyrsia/shared/process_env.py": "writes the environment child processes inherit",
}
"""The library modules allowed to touch ``os.environ`` (at most three: issue 47)."""
_OS_NAMES = {"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"}


def environment_uses(source: str) -> list[int]:
    """Lines of ``source`` that touch the process environment: ``os.environ``,
    ``os.getenv`` and kin, or one of them imported from ``os``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _OS_NAMES
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(alias.name in _OS_NAMES for alias in node.names):
                lines.append(node.lineno)
    return sorted(lines)


def _library_files() -> list[Path]:
    return sorted([*(ROOT / "persia").rglob("*.py"), *(ROOT / "pyrsia").rglob("*.py")])


def test_only_the_settings_modules_touch_the_environment() -> None:
    assert len(ENV_READERS) <= 3
    offenders = []
    for path in _library_files():
        name = path.relative_to(ROOT).as_posix()
        if name in ENV_READERS:
            continue
        offenders += [f"{name}:{line}" for line in environment_uses(path.read_text())]
    assert not offenders, (
        "read the environment through pyrsia.shared.settings (a Settings passed down from the "
        "entry point) or write it through pyrsia.shared.process_env:\n" + "\n".join(offenders)
    )


def test_the_allowlisted_modules_exist() -> None:
    for name in ENV_READERS:
        assert environment_uses((ROOT / name).read_text()), f"{name} no longer needs its place"


@pytest.mark.parametrize(
    "source",
    [
        "import os\nx = os.environ.get('A')\n",
        "import os\ndef f():\n    return os.getenv('A')\n",
        "from os import environ\n",
        "import os\nos.environ['A'] = '1'\n",
    ],
)
def test_the_guard_sees_every_form(source: str) -> None:
    assert environment_uses(source)


def test_the_guard_leaves_a_passed_mapping_alone() -> None:
    assert not environment_uses("def f(environ):\n    return environ.get('A')\n")


# --- the Settings object ----------------------------------------------------------------
def test_settings_is_a_frozen_snapshot() -> None:
    source = {"PERSIA_JOB_ID": "j1"}
    settings = Settings.from_env(source)
    source["PERSIA_JOB_ID"] = "j2"
    assert settings.job_id == "j1"
    with pytest.raises(AttributeError):
        settings.environ = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        settings.environ["PERSIA_JOB_ID"] = "j3"  # type: ignore[index]


def test_settings_defaults() -> None:
    settings = Settings.from_env({})
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert not settings.redis_url_given
    assert settings.job_id == "default"
    assert settings.bind_host == "127.0.0.1"
    assert settings.log_level == "INFO"
    assert not settings.verbose
    assert settings.wait_timeout_s(7.0) == 7.0
    assert settings.positive("PYRSIA_BODY_TIMEOUT_S", float) is None


def test_settings_repr_hides_the_environment() -> None:
    settings = Settings.from_env({"PERSIA_AUTH_TOKEN": "s3cret-token-value"})
    assert "s3cret" not in repr(settings)


def test_registry_settings_come_from_a_settings_object() -> None:
    settings = Settings.from_env({"PERSIA_REDIS_URL": "redis://h:1/2", "PERSIA_JOB_ID": "j"})
    assert RegistrySettings.from_env(settings) == RegistrySettings("redis://h:1/2", "j")
    assert wait_timeout_s(3.0, Settings.from_env({"PERSIA_WAIT_TIMEOUT_S": "9"})) == 9.0


@pytest.mark.parametrize(
    ("environ", "read", "message"),
    [
        (
            {"PERSIA_WAIT_TIMEOUT_S": "soon"},
            lambda s: s.wait_timeout_s(1.0),
            "PERSIA_WAIT_TIMEOUT_S: expected a positive number of seconds, got 'soon'",
        ),
        (
            {"PERSIA_WAIT_TIMEOUT_S": "-3"},
            lambda s: s.wait_timeout_s(1.0),
            "PERSIA_WAIT_TIMEOUT_S: expected a positive number of seconds, got '-3'",
        ),
        (
            {"PYRSIA_BODY_TIMEOUT_S": "0"},
            lambda s: s.positive("PYRSIA_BODY_TIMEOUT_S", float),
            "PYRSIA_BODY_TIMEOUT_S: expected a positive number (seconds), got '0'",
        ),
        (
            {"PYRSIA_MAX_CONNECTIONS": "many"},
            lambda s: s.positive("PYRSIA_MAX_CONNECTIONS", int, ""),
            "PYRSIA_MAX_CONNECTIONS: expected a positive integer, got 'many'",
        ),
        (
            {"PYRSIA_MAX_INFLIGHT_REQUEST_BYTES": "1.5"},
            lambda s: s.positive("PYRSIA_MAX_INFLIGHT_REQUEST_BYTES", int),
            "PYRSIA_MAX_INFLIGHT_REQUEST_BYTES: expected a positive integer (bytes), got '1.5'",
        ),
        (
            {"PERSIA_INSECURE": "maybe"},
            lambda s: s.yes_no("PERSIA_INSECURE"),
            "PERSIA_INSECURE: expected 1/true/yes/on or 0/false/no/off, got 'maybe'",
        ),
    ],
)
def test_a_bad_value_names_the_variable_and_what_was_expected(environ, read, message) -> None:
    settings = Settings.from_env(environ)  # built without complaint: checked when read
    with pytest.raises(ConfigError) as caught:
        read(settings)
    assert str(caught.value) == message


def test_nats_without_redis_names_what_to_set() -> None:
    with pytest.raises(RegistryError, match="PERSIA_NATS_URL is set but .* set PERSIA_REDIS_URL"):
        Settings.from_env({"PERSIA_NATS_URL": "nats://x:4222"}).check_no_nats_without_redis()
    both = {"PERSIA_NATS_URL": "nats://x:4222", "PERSIA_REDIS_URL": "redis://h:1/0"}
    Settings.from_env(both).check_no_nats_without_redis()


def test_yes_no_and_verbose_read_their_words() -> None:
    assert Settings.from_env({"PERSIA_INSECURE": " On "}).yes_no("PERSIA_INSECURE")
    assert not Settings.from_env({"PERSIA_INSECURE": "off"}).yes_no("PERSIA_INSECURE")
    assert Settings.from_env({"PERSIA_VERBOSE": "yes"}).verbose
    assert Settings.from_env({"LOG_LEVEL": "Debug"}).verbose


# --- timeouts and limits live in constants/ ----------------------------------------------
_LIMIT_NAME = re.compile(r"^_?(\w*_S|\w*_SECONDS|\w*TIMEOUT\w*|MAX_\w+|MIN_\w+)$")
_TIME_ARG = re.compile(r"(_s$|_ms$|_seconds$|timeout|interval)")
LITERAL_ALLOWED = {
    "pyrsia/services/embedding_ps/shard.py MIN_ROWS": "the hash table's layout, not a limit",
    "pyrsia/services/embedding_ps/shard.py MIN_SLOTS": "the hash table's layout, not a limit",
    "pyrsia/services/embedding_ps/shard.py MAX_LOAD": "the hash table's load factor",
    "pyrsia/services/embedding_ps/shard_set.py MAX_DIMS": "arena ids are int8",
    "persia/utils.py interval": "find_free_port's port step (PERSIA's API), not a time",
    "pyrsia/shared/global_schema.py push_interval_seconds": "a global_config.yml default",
    "pyrsia/shared/global_schema.py incremental_scan_interval_seconds": "a global_config.yml default",
}
"""``path name`` -> why a literal there is not a timeout or limit to move."""


def _number(node: ast.AST) -> bool:
    """A nonzero numeric literal, or arithmetic of literals (``1 << 16``, ``1000 * 60``)."""
    if isinstance(node, ast.BinOp):
        return _number(node.left) and _number(node.right)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    value = getattr(node, "value", None)
    return isinstance(node, ast.Constant) and type(value) in (int, float) and value != 0


def _defaults(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, ast.AST]]:
    a = node.args
    positional = a.posonlyargs + a.args
    given = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
    given += [(x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
    return [(arg.arg, default) for arg, default in given]


def literal_limits(source: str) -> list[tuple[int, str]]:
    """(line, name) of each timeout or limit written as a number: a module constant named
    like one (``*_S``, ``*TIMEOUT*``, ``MAX_*``, ``MIN_*``), a ``timeout=`` argument, a
    ``sleep`` of a number, or a time-like parameter or field with a number as default."""
    tree = ast.parse(source)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and _LIMIT_NAME.match(target.id):
                if _number(node.value):
                    found.append((node.lineno, target.id))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            for k in node.keywords:
                if k.arg and "timeout" in k.arg and _number(k.value):
                    found.append((node.lineno, k.arg))
            if name == "sleep" and node.args and _number(node.args[0]):
                found.append((node.lineno, "sleep"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for arg, default in _defaults(node):
                if _TIME_ARG.search(arg) and _number(default):
                    found.append((node.lineno, arg))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if _TIME_ARG.search(node.target.id) and node.value and _number(node.value):
                found.append((node.lineno, node.target.id))
    return found


def test_timeouts_and_limits_are_named_in_constants() -> None:
    offenders = []
    for path in _library_files():
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("pyrsia/shared/constants/"):
            continue
        for line, what in literal_limits(path.read_text()):
            if f"{name} {what}" not in LITERAL_ALLOWED:
                offenders.append(f"{name}:{line} {what}")
    assert not offenders, (
        "name these timeouts and limits in pyrsia/shared/constants/ (the module of their topic):\n"
        + "\n".join(offenders)
    )


def test_the_constants_package_re_exports_every_name_of_its_modules() -> None:
    """``from pyrsia.shared.constants import X`` finds every name of every topic module, and no
    name is defined by two of them (the package's star imports would hide one)."""
    import importlib
    import pkgutil

    import pyrsia.shared.constants as constants

    where: dict[str, str] = {}
    for info in pkgutil.iter_modules(constants.__path__):
        module = importlib.import_module(f"{constants.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name.startswith("_"):
                continue
            assert name not in where, f"{name} is defined in {where[name]} and {info.name}"
            where[name] = info.name
            assert getattr(constants, name, None) is value, f"{info.name}.{name} not re-exported"
    assert {"ENV_REDIS_URL", "LOOKUP_TIMEOUT_S", "MAX_BATCH_SIZE", "service_key"} <= set(where)


@pytest.mark.parametrize(
    "source",
    [
        "STOP_TIMEOUT_S = 20.0\n",
        "MAX_ITEMS = 1 << 16\n",
        "s.connect(timeout=0.2)\n",
        "time.sleep(0.05)\n",
        "def f(wait_s: float = 3.0):\n    pass\n",
    ],
)
def test_the_literal_guard_sees_every_form(source: str) -> None:
    assert literal_limits(source)


def test_the_literal_guard_leaves_named_values_alone() -> None:
    source = "X_S = OTHER_S\ns.connect(timeout=CONNECT_TIMEOUT_S)\nawait asyncio.sleep(0)\n"
    assert not literal_limits(source)
