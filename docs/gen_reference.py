"""Generate the reference pages from the code, so they cannot drift from it.

``mkdocs build`` runs this file through the mkdocs-gen-files plugin (``mkdocs.yml``);
nothing it writes is committed. It produces:

- ``reference/config.md``: every key of ``embedding_config.yml`` and ``global_config.yml``
  (walked from the frozen dataclasses in ``pyrsia.shared.config_schema``), every EPL key
  (``persia.epl.config.KEYS``) and every HybridBackend option (``persia.hb._options.SPECS``),
  with type and default read from the code and the meaning from :data:`MEANINGS`;
- ``reference/cli.md``: every flag of ``persia-launcher``'s subcommands, ``persia-k8s-utils``
  and ``python -m persia.hb.run``, read from their argparse parsers;
- ``reference/api/<module>.md``: one mkdocstrings page per public ``persia`` module.

``tests/test_docs.py`` imports this module and checks that every schema key has a row
and a meaning. Run it by hand with ``python docs/gen_reference.py OUT_DIR`` to see the
pages without building the site.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# --------------------------------------------------------------------------- config keys

SLOT = "slots_config.<slot>"
GROUP = "feature_groups.<group>"

# What each key does in Pyrsia. Keys, types and defaults come from the schema; a key
# missing here (or a meaning for a key the schema lacks) fails tests/test_docs.py.
MEANINGS: dict[str, dict[str, str]] = {
    "embedding_config.yml": {
        "feature_index_prefix_bit": "top bits of an id that hold its feature group, so equal "
        "ids in two slots are different embeddings (1 to 63)",
        f"{SLOT}.dim": "embedding width (required, a positive integer)",
        f"{SLOT}.embedding_summation": "sum a sample's vectors to `(batch, dim)`; false: raw "
        "`(batch, sample_fixed_size, dim + 1)`, the last column 1 for a real id",
        f"{SLOT}.sqrt_scaling": "scale the sum by 1/sqrt(ids in the sample)",
        f"{SLOT}.sample_fixed_size": "ids kept per sample in raw mode",
        f"{SLOT}.hash_stack_config.hash_stack_rounds": "replace each id by R hashed buckets in "
        "[0, R·E) (R = this key; 0 = off)",
        f"{SLOT}.hash_stack_config.embedding_size": "E of the hash stack; must be positive "
        "when `hash_stack_rounds` > 0",
        GROUP: "a list of slots that share one prefix (one embedding space); a slot belongs to "
        "at most one group, and a group must not have the name of a slot",
    },
    "global_config.yml": {
        "common_config.job_type": "`Train`, `Eval` or `Infer` (matched case-insensitively)",
        "common_config.metrics_config.enable_metrics": "push metrics to the Prometheus push "
        "gateway at `PERSIA_METRICS_GATEWAY_ADDR` (every service serves `/metrics` regardless)",
        "common_config.metrics_config.job_name": "the push gateway's job name",
        "common_config.metrics_config.push_interval_seconds": "seconds between pushes",
        "common_config.checkpointing_config.num_workers": "threads each PS replica dumps and "
        "loads its checkpoint with (1 to 64); the files are byte-identical for any value",
        "common_config.checkpointing_config.checkpoint_dir": "where periodic checkpoints go "
        "(seen by every NN worker and PS replica); required when periodic checkpoints are on",
        "common_config.checkpointing_config.checkpoint_every_n_steps": "periodic point-in-time "
        "checkpoint of the whole job every N steps (0 = off)",
        "common_config.checkpointing_config.checkpoint_every_n_seconds": "the same, every N "
        "seconds (0 = off)",
        "common_config.checkpointing_config.keep_checkpoints": "complete checkpoints kept",
        "common_config.infer_config.servers": "inference (`job_type: Infer`): a list of "
        '`"host:port"`; PS replica i listens at `servers[i]`, and embedding workers dial '
        "those addresses, so nothing needs Redis",
        "common_config.infer_config.embedding_checkpoint": "inference: the checkpoint each "
        "Infer PS replica loads at start",
        "embedding_parameter_server_config.capacity": "embedding vectors per PS replica (not "
        "floats); least-recently-used eviction beyond",
        "embedding_parameter_server_config.num_hashmap_internal_shards": "internal shards of "
        "the PS store (capped at 64)",
        "embedding_parameter_server_config.enable_incremental_update": "training PS: write "
        "changed entries as packets; Infer PS: apply the packets found in `incremental_dir`",
        "embedding_parameter_server_config.incremental_buffer_size": "a packet is written "
        "every N distinct updated ids",
        "embedding_parameter_server_config.incremental_dir": "where incremental packets are "
        "written and read",
        "embedding_parameter_server_config.incremental_channel_capacity": "PERSIA's packet "
        "queue; packets are written at once here, so only the default is accepted",
        "embedding_parameter_server_config.incremental_scan_interval_seconds": "how often an "
        "Infer PS looks for new packets (PERSIA's fixed 10 s, made a key; integer >= 1)",
        "embedding_worker_config.forward_buffer_size": "buffered batches per data loader "
        "(429 beyond)",
        "embedding_worker_config.buffered_data_expired_sec": "buffered batches expire after "
        "this many seconds",
    },
}


def _show_default(value: object) -> str:
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[]" if not value else repr(list(value))
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int):
        return f"{value:,}".replace(",", "_") if value >= 10**6 else str(value)
    return repr(value)


def _type_name(hint: object) -> str:
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(m.value for m in hint)
    origin = typing.get_origin(hint)
    if origin is tuple:
        return "list of " + _type_name(typing.get_args(hint)[0])
    return {int: "integer", bool: "boolean", str: "string", float: "number"}.get(hint, str(hint))


def _walk(cls: type, prefix: str) -> Iterator[tuple[str, str, str]]:
    """(key path, type, default) for every leaf field of a frozen config dataclass."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.name.startswith("_"):
            continue
        hint = hints[f.name]
        path = f"{prefix}.{f.name}" if prefix else f.name
        if dataclasses.is_dataclass(hint):
            yield from _walk(hint, path)
            continue
        if f.default is dataclasses.MISSING:
            yield path, _type_name(hint), "(required)"
        else:
            yield path, _type_name(hint), _show_default(f.default)


def schema_keys() -> dict[str, list[tuple[str, str, str]]]:
    """Every key of the two YAML files, walked from ``pyrsia.shared.config_schema``."""
    from pyrsia.shared import config_schema as cs

    embedding: list[tuple[str, str, str]] = []
    for f in dataclasses.fields(cs.EmbeddingSchema):
        if not f.init:
            continue
        if f.name == "slots_config":
            for path, type_, default in _walk(cs.SlotConfig, SLOT):
                if path != f"{SLOT}.name":  # the slot's name is its key in the mapping
                    embedding.append((path, type_, default))
        elif f.name == "feature_groups":
            embedding.append((GROUP, "list of slot names", "(none)"))
        else:
            embedding.append((f.name, "integer", _show_default(f.default)))
    return {
        "embedding_config.yml": embedding,
        "global_config.yml": list(_walk(cs.GlobalConfig, "")),
    }


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines + [""]


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

# Variables named in pyrsia/shared/constants.py whose meaning needs more than the constant's own
# docstring (or that have none). Every ENV_* constant needs one or the other.
ENV_MEANINGS: dict[str, str] = {
    "PERSIA_REDIS_URL": "the registry's Redis (default `redis://127.0.0.1:6379/0`); put "
    "Redis's password in it",
    "PERSIA_JOB_ID": "namespaces every registry key (default `default`), so two jobs can "
    "share one Redis",
    "PERSIA_EMBEDDING_CONFIG": "`embedding_config.yml` when `--embedding-config` is not given",
    "PERSIA_GLOBAL_CONFIG": "`global_config.yml` when `--global-config` is not given "
    "(built-in defaults when neither is set)",
    "PERSIA_NN_WORKER_ENTRY": "the `train.py` of `persia-launcher nn-worker` when no script "
    "is given",
    "PERSIA_DATALOADER_ENTRY": "the `data_loader.py` of `persia-launcher data-loader` when no "
    "script is given",
    "PERSIA_ADVERTISE_HOST": "the name or address other processes dial to reach this one "
    "(the Kubernetes manifests set the pod IP)",
    "LOG_LEVEL": "DEBUG, INFO, WARNING or ERROR (default INFO): the services' level and the "
    "default of `get_default_logger` and of the `persia` logger",
    "PERSIA_MALLOC_TUNING": "`1` (default) or `0`: `0` leaves the NN worker's and the "
    "services' malloc at glibc's defaults; why they are changed: `pyrsia/shared/allocator.py`. "
    "A bad value stops a service at start with exit 2",
    "PYRSIA_MAX_MESSAGE_BYTES": "largest request body a server accepts (413 beyond) when "
    "`--max-request-bytes` is not given; default 1 GiB",
    "PYRSIA_BODY_TIMEOUT_S": "longest gap in a request body, and the grace before the "
    "minimum body rate applies (default 30 s)",
}

OTHER_ENV: list[tuple[str, str]] = [
    ("PERSIA_BIND_HOST", "address servers bind when `--host` is not given (default "
     "`127.0.0.1`; the image, `docker-compose.yml` and the Kubernetes manifests set `0.0.0.0`)"),
    ("EMBEDDING_WORKER_SERVICE", "comma-separated `host:port` of embedding workers, used "
     "instead of the registry (PERSIA's variable; `persia.service`, `persia-launcher serve`)"),
    ("REPLICA_INDEX, REPLICA_SIZE", "set by `persia-launcher data-loader`; read by "
     "`persia.env.get_replica_index()` / `get_replica_size()` (default 0 / 1)"),
    ("RANK, LOCAL_RANK, WORLD_SIZE", "set by torch's launcher for each NN-worker rank; `RANK` "
     "alone says whether a process is an NN worker ([Coming from PERSIA]"
     "(../guides/persia-migration.md#behaviours-kept))"),
    ("EPL_<CATEGORY>_<ATTRIBUTE>", "every EPL key ([configuration reference](config.md"
     "#epl-keys-persiaeplconfig))"),
    ("HB_<NAME>", "HybridBackend options ([configuration reference](config.md"
     "#hybridbackend-options-hbcontextoptions))"),
]  # fmt: skip


def env_constants() -> list[tuple[str, str]]:
    """(variable, docstring) for every ``ENV_*`` constant of ``pyrsia/shared/constants.py``."""
    import ast

    tree = ast.parse((ROOT / "pyrsia" / "shared" / "constants.py").read_text())
    body = tree.body
    found = []
    for i, node in enumerate(body):
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or not target.id.startswith("ENV_"):
            continue
        values = ast.literal_eval(node.value)
        doc = ""
        nxt = body[i + 1] if i + 1 < len(body) else None
        if isinstance(nxt, ast.Expr) and isinstance(getattr(nxt, "value", None), ast.Constant):
            doc = " ".join(str(nxt.value.value).split())
        for name in (values,) if isinstance(values, str) else values:
            found.append((name, doc))
    return found


def environment_reference() -> str:
    out = [
        "# Environment variables",
        "",
        "Generated at build time (`docs/gen_reference.py`) from the `ENV_*` constants of "
        "`pyrsia/shared/constants.py`. Variables are read when a process or object starts, never at "
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
            default = "`127.0.0.1`"  # the parser reads $PERSIA_BIND_HOST when built
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
