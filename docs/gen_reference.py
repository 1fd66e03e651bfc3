"""Generate the reference pages from the code, so they cannot drift from it.

``mkdocs build`` runs this file through the mkdocs-gen-files plugin (``mkdocs.yml``);
nothing it writes is committed. It produces:

- ``reference/config.md``: every key of ``embedding_config.yml`` and ``global_config.yml``
  (walked from the frozen dataclasses in ``pyrsia.shared.config_schema``), every EPL key
  (``persia.epl.config.KEYS``) and every HybridBackend option (``persia.hb._options.SPECS``),
  with type and default read from the code and the meaning from ``MEANINGS``
  (``docs/config_keys.py``);
- ``reference/environment.md``: every variable Pyrsia reads (``docs/env_vars.py``);
- ``reference/metrics.md``: every Prometheus metric the code defines;
- ``reference/cli.md``: every flag of ``persia-launcher``'s subcommands, ``persia-k8s-utils``
  and ``python -m persia.hb.run``, read from their argparse parsers;
- ``reference/api/<module>.md``: one mkdocstrings page per public ``persia`` module.

``tests/test_docs.py`` imports this module and checks that every schema key has a row
and a meaning (``MEANINGS``, ``ENV_MEANINGS`` and ``env_constants`` are re-exported here
from their modules). Run it by hand with ``python docs/gen_reference.py OUT_DIR`` to see the
pages without building the site.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
for _path in (ROOT, DOCS):  # the code, and this file's siblings (mkdocs runs it by path)
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from config_keys import MEANINGS, schema_keys  # noqa: E402 (needs the path above)
from env_vars import ENV_MEANINGS, OTHER_ENV, env_constants  # noqa: E402

# --------------------------------------------------------------------------- tables


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


# --------------------------------------------------------------------------- config keys


def config_reference() -> str:
    from persia.epl import config as epl_config
    from persia.hb import _options as hb_options

    out = [
        "# Configuration reference",
        "",
        "Generated from the code at build time (`docs/gen_reference.py`): keys, types and "
        "defaults are read from `pyrsia/shared/config_schema.py`, `persia/epl/config.py` and "
        "`persia/hb/_options.py`. How the files are found and checked: "
        "[Configuration files](../guides/configuration.md).",
        "",
    ]
    for filename, keys in schema_keys().items():
        meanings = MEANINGS[filename]
        out += [f"## `{filename}`", ""]
        rows = [(f"`{k}`", t, f"`{d}`", meanings.get(k, "")) for k, t, d in keys]
        out += _table(("key", "type", "default", "meaning"), rows)

    out += [
        "## EPL keys (`persia.epl.Config`)",
        "",
        "Each key can also come from the environment as `EPL_<CATEGORY>_<ATTRIBUTE>`; what "
        "each one does in Pyrsia: [EPL options](../guides/epl.md).",
        "",
    ]
    rows = []
    for key, spec in epl_config.KEYS.items():
        rows.append(
            (f"`{key}`", spec.type_name, f"`{spec.default!r}`", f"`{epl_config.env_name(key)}`")
        )
    out += _table(("key", "type", "default", "environment"), rows)

    out += [
        "## HybridBackend options (`hb.context.options`)",
        "",
        "What each option does: [HybridBackend API](../guides/hybridbackend.md).",
        "",
    ]
    rows = []
    for name, spec in hb_options.SPECS.items():
        env = f"`{spec.env_name}`" if spec.env else "(none)"
        rows.append((f"`{name}`", spec.expected, f"`{spec.default!r}`", env, spec.doc))
    out += _table(("option", "accepts", "default", "environment", "meaning"), rows)
    return "\n".join(out)


# --------------------------------------------------------------------------- environment


def environment_reference() -> str:
    out = [
        "# Environment variables",
        "",
        "Generated at build time (`docs/gen_reference.py`) from the `ENV_*` constants of "
        "`pyrsia/shared/constants/env_names.py`. Variables are read when a process or object starts, never at "
        "import. A flag, where there is one, wins over its variable.",
        "",
    ]
    rows = [
        (f"`{name}`", (ENV_MEANINGS.get(name) or doc).replace("|", " / "))
        for name, doc in env_constants()
    ]
    out += _table(("variable", "meaning"), rows)
    out += ["## Other variables", ""]
    out += _table(("variable", "meaning"), [(f"`{n}`", m) for n, m in OTHER_ENV])
    return "\n".join(out)


# --------------------------------------------------------------------------- metrics

METRIC_SOURCES = ("pyrsia", "persia")
_METRIC_KINDS = ("Counter", "Gauge", "Histogram", "Summary")
_METRIC_FAMILIES = {"CounterMetricFamily": "Counter", "GaugeMetricFamily": "Gauge"}
"""prometheus_client.core families a custom collector yields (``CounterMetricFamily("pyrsia_..", help)``)."""


def metric_definitions() -> list[tuple[str, str, str, str, str]]:
    """(name, kind, labels, help, file) for every ``prom.<Kind>("pyrsia_...", help)`` call
    and every ``CounterMetricFamily``/``GaugeMetricFamily("pyrsia_...", help)`` a collector yields."""
    import ast

    found = []
    for top in METRIC_SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or len(node.args) < 2:
                    continue
                func = node.func
                kind = func.attr if isinstance(func, ast.Attribute) else ""
                if isinstance(func, ast.Name) and func.id in _METRIC_FAMILIES:
                    kind = _METRIC_FAMILIES[func.id]  # a custom collector's family
                if kind not in _METRIC_KINDS:
                    continue
                name, help_ = node.args[0], node.args[1]
                if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                    continue
                if not name.value.startswith("pyrsia_"):
                    continue
                text = help_.value if isinstance(help_, ast.Constant) else ""
                labels = ""
                label_arg = node.args[2] if len(node.args) > 2 else None
                for kw in node.keywords:
                    if kw.arg == "labelnames":
                        label_arg = kw.value
                if isinstance(label_arg, ast.List | ast.Tuple):
                    labels = ", ".join(
                        str(e.value) for e in label_arg.elts if isinstance(e, ast.Constant)
                    )
                exposed = name.value + ("_total" if kind == "Counter" else "")
                rel = path.relative_to(ROOT).as_posix()
                found.append((exposed, kind.lower(), labels, str(text), rel))
    return found


def metrics_reference() -> str:
    out = [
        "# Metrics",
        "",
        "Generated at build time (`docs/gen_reference.py`) from the Prometheus metrics the "
        "code defines. Each server answers `GET /metrics` in Prometheus text format. "
        "How to use them: [Observability](../guides/observability.md).",
        "",
    ]
    rows = [
        (f"`{name}`", kind, labels, help_, f"`{where}`")
        for name, kind, labels, help_, where in metric_definitions()
    ]
    out += _table(("metric", "type", "labels", "meaning", "defined in"), rows)
    return "\n".join(out)


# --------------------------------------------------------------------------- CLI

# (title, module with build_parser(), how it is invoked)
COMMANDS: list[tuple[str, str]] = [
    ("persia-launcher embedding-parameter-server", "pyrsia.services.embedding_ps.main"),
    ("persia-launcher embedding-worker", "pyrsia.services.embedding_worker.main"),
    ("persia-launcher nn-worker", "pyrsia.services.nn_worker.launch"),
    ("persia-launcher data-loader", "pyrsia.services.data_loader.launch"),
    ("persia-launcher run", "persia._launch.run"),
    ("persia-launcher serve", "persia._launch.serve"),
    ("persia-launcher convert-checkpoint", "pyrsia.services.embedding_ps.persia_convert"),
    ("persia-launcher status", "persia._launch.status"),
    ("persia-launcher prometheus-targets", "persia._launch.prometheus"),
    ("persia-k8s-utils", "persia.k8s_utils"),
    ("python -m persia.hb.run", "persia.hb.run"),
]


def _actions(parser: argparse.ArgumentParser) -> list[tuple[str, ...]]:
    rows = []
    for action in parser._actions:  # argparse has no public accessor for its arguments
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        name = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        if action.default in (None, argparse.SUPPRESS) or action.option_strings == []:
            default = ""
        elif isinstance(action, argparse._StoreTrueAction):
            default = "off"
        else:
            default = f"`{action.default}`"
        if action.dest == "host":
            default = "`127.0.0.1`"  # $PERSIA_BIND_HOST, else loopback, resolved by the entry point
        help_ = (action.help or "").replace("%(default)s", str(action.default))
        rows.append((name, default, help_))
    return rows


def _parser_section(title: str, parser: argparse.ArgumentParser) -> list[str]:
    usage = parser.format_usage().strip().removeprefix("usage: ")
    out = [f"## `{title}`", ""]
    if parser.description:
        out += [parser.description.strip(), ""]
    out += ["```text", usage, "```", ""]
    out += _table(("flag", "default", "meaning"), _actions(parser))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _parser_section(f"{title} {name}", sub)
    return out


def cli_reference() -> str:
    import os

    from persia import launcher

    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines at the terminal's width

    out = [
        "# Command-line reference",
        "",
        "Generated from the argparse parsers at build time (`docs/gen_reference.py`). "
        "`persia-launcher <command> --help` prints the same.",
        "",
        "## `persia-launcher`",
        "",
        "```text",
        launcher._usage(),
        "```",
        "",
        "A missing file or an unreachable Redis is one line on stderr and exit code 2.",
        "",
    ]
    for title, module in COMMANDS:
        parser = importlib.import_module(module).build_parser()
        out += _parser_section(title, parser)
    return "\n".join(out)


# --------------------------------------------------------------------------- Python API

API_MODULES = [
    "persia.ctx",
    "persia.data",
    "persia.embedding",
    "persia.embedding.data",
    "persia.embedding.optim",
    "persia.distributed",
    "persia.env",
    "persia.errors",
    "persia.logger",
    "persia.utils",
    "persia.service",
    "persia.serving",
    "persia.epl",
    "persia.epl.pipeline",
    "persia.hb",
    "persia.hb.data",
    "persia.hb.embedding",
    "persia.hb.metrics",
    "persia.hb.train",
]


def api_page(module: str) -> str:
    return f"# `{module}`\n\n::: {module}\n"


# --------------------------------------------------------------------------- pages


def pages() -> dict[str, str]:
    """Every generated page: path under docs/ -> markdown."""
    result = {
        "reference/config.md": config_reference(),
        "reference/cli.md": cli_reference(),
        "reference/environment.md": environment_reference(),
        "reference/metrics.md": metrics_reference(),
    }
    for module in API_MODULES:
        result[f"reference/api/{module}.md"] = api_page(module)
    return result


def _write_with_gen_files() -> None:
    import mkdocs_gen_files

    for path, text in pages().items():
        with mkdocs_gen_files.open(path, "w") as fh:
            fh.write(text)
        mkdocs_gen_files.set_edit_path(path, "gen_reference.py")


if __name__ == "__main__" and len(sys.argv) == 2:
    out_dir = Path(sys.argv[1])
    for rel, text in pages().items():
        target = out_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        print(target)
elif __name__ in ("__main__", "<run_path>"):
    _write_with_gen_files()
