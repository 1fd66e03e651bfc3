"""One meaning per module name (issue 26): a basename used by two modules of persia/ and
pyrsia/ must be one of the intended repetitions below, each with the reason it is the same
meaning (or a public name PERSIA, EPL or HybridBackend fixed). A newcomer who reads
``server.py`` or ``kernels.py`` knows what the module is wherever it sits."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INTENDED: dict[str, str] = {
    "__init__": "every package",
    "__main__": "python -m pyrsia.services.<service>: each service folder's process",
    "main": "each service's command line (embedding_ps, embedding_worker)",
    "launch": "each service's persia-launcher command (nn_worker, data_loader)",
    "server": "each server process's HTTP routes (embedding_ps, embedding_worker, persia.serving)",
    "kernels": "each service's compiled numba kernels (embedding_ps, embedding_worker)",
    "warm": "each engine's numba kernels run once before they are needed (embedding_ps, "
    "embedding_worker)",
    "sender": "the data loader's batch sender: to the NN workers over HTTP (data_loader), to "
    "the training loop of the same process (embedded)",
    "persia_metrics": "each service's series under PERSIA's metric names (embedding_ps, "
    "embedding_worker)",
    "data": "public names: persia.data and persia.embedding.data (PERSIA), persia.hb.data "
    "(HybridBackend's hb.data)",
    "errors": "persia.errors is pyrsia.shared.errors re-exported: the one exception tree",
    "config": "persia.epl.config is EPL's epl.config (its Config); pyrsia.shared.config loads "
    "PERSIA's YAML files; both read keys with pyrsia.shared.options",
    "run": "persia.hb.run is HybridBackend's hybridbackend.run; persia/_launch/run.py is "
    "persia-launcher run",
}

WIRE_MIRRORS = {"batch", "ingress", "serve"}
"""``pyrsia/shared/wire/<name>.py`` holds the message bodies of the routes of the module of
the same name (wire/ingress.py: the NN worker's ingress; wire/serve.py: persia-launcher
serve's /predict; wire/batch.py: the batch that nn_worker/batch.py wraps)."""


def module_paths() -> dict[str, list[str]]:
    by_name: dict[str, list[str]] = defaultdict(list)
    for package in ("persia", "pyrsia"):
        for path in (ROOT / package).rglob("*.py"):
            by_name[path.stem].append(path.relative_to(ROOT).as_posix())
    return by_name


def test_a_repeated_module_name_is_an_intended_one():
    unexplained = {}
    for name, paths in module_paths().items():
        if len(paths) < 2 or name in INTENDED:
            continue
        if name in WIRE_MIRRORS and f"pyrsia/shared/wire/{name}.py" in paths and len(paths) == 2:
            continue
        unexplained[name] = sorted(paths)
    assert unexplained == {}, (
        "module names with two meanings: rename one so the name says what it is, or add it "
        "to INTENDED with the reason it is one meaning"
    )


def test_gradient_recomputation_is_not_called_checkpointing():
    """EPL's gradient_checkpoint.* keys keep EPL's spelling; the module says what it does."""
    names = module_paths()
    assert "checkpointing" not in names
    assert names["recompute"] == ["persia/epl/recompute.py"]
