"""``persia-launcher convert-checkpoint``: a PERSIA embedding checkpoint -> a Pyrsia one.

::

    persia-launcher convert-checkpoint --persia-dir /ckpt/persia --output /ckpt/pyrsia \\
        --optimizer '{"type": "adagrad", "lr": 0.01}'

reads every ``s<r>/replica_<r>_shard_<i>.emb`` of a complete PERSIA checkpoint
(:mod:`pyrsia.services.embedding_ps.persia_format`) and writes a Pyrsia checkpoint directory with the
PS's own writer (:func:`pyrsia.services.embedding_ps.checkpoint.dump_store`, one part that any number of
PS replicas loads: ``ctx.load_checkpoint`` or the PS's ``/load``).

PERSIA's files do not say which optimizer trained them, so ``--optimizer`` names it (the wire
form of the one ``train.py`` registers) and is checked against the state each entry carries:
SGD none, Adagrad ``dim`` values (1 with ``vectorwise_shared``), Adam ``m | v`` (``2 * dim``).
Pyrsia's Adam also keeps a step per entry for its bias correction, which PERSIA does not store
(its powers of the betas live in memory per feature group and restart when a job restarts):
``--adam-step`` sets it (default 0, bias correction restarts, as in a restarted PERSIA job).
SGD with momentum starts its buffers at zero. A bad input is one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from pyrsia.services.embedding_ps.checkpoint import dump_store
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.optimizers import state_width
from pyrsia.services.embedding_ps.persia_format import PersiaTable, read_checkpoint
from pyrsia.shared.cli import fail
from pyrsia.shared.embedding_spec import (
    AdagradSpec,
    AdamSpec,
    OptimizerSpec,
    optimizer_from_dict,
    optimizer_to_dict,
)
from pyrsia.shared.errors import InvalidInputError

log = logging.getLogger(__name__)


def persia_state_width(spec: OptimizerSpec, dim: int) -> int:
    """Optimizer-state values PERSIA stores after a ``dim``-wide embedding under ``spec``."""
    if isinstance(spec, AdagradSpec):
        return 1 if spec.vectorwise_shared else dim
    if isinstance(spec, AdamSpec):
        return 2 * dim
    return 0


def _state_names(dim: int, width: int) -> str:
    names = {0: "none (SGD)", dim: "Adagrad", 1: "Adagrad with vectorwise_shared", 2 * dim: "Adam"}
    return names.get(width, "no PERSIA optimizer")


def pyrsia_rows(table: PersiaTable, spec: OptimizerSpec, adam_step: int) -> np.ndarray:
    """``table``'s rows in Pyrsia's layout ``[embedding | state]`` for ``spec``."""
    dim = table.dim
    have, want = table.inner.shape[1] - dim, persia_state_width(spec, dim)
    if have != want:
        raise InvalidInputError(
            "--optimizer",
            f"an optimizer whose state matches the checkpoint's dim {dim} entries: {have} state "
            f"values each, which is {_state_names(dim, have)}",
            f"{optimizer_to_dict(spec)} ({want} values)",
        )
    rows = np.zeros((table.ids.shape[0], dim + state_width(spec, dim)), dtype=np.float32)
    rows[:, : dim + have] = table.inner
    if isinstance(spec, AdamSpec):
        rows[:, 3 * dim] = adam_step
    return rows


def convert(
    persia_dir: str | Path,
    output: str | Path,
    optimizer: OptimizerSpec,
    *,
    adam_step: int = 0,
    workers: int = 4,
) -> dict:
    """Convert; returns the written manifest plus ``seconds`` (read, build, write)."""
    started = time.perf_counter()
    tables = read_checkpoint(persia_dir)
    total = sum(t.ids.shape[0] for t in tables)
    if not total:
        raise InvalidInputError("--persia-dir", "a checkpoint with at least one entry", 0)
    every = np.concatenate([t.ids for t in tables])
    if np.unique(every).shape[0] != total:
        raise InvalidInputError("--persia-dir", "each id stored at one dim", "ids at two dims")
    store = EmbeddingStore(total, num_shards=1, optimizer=optimizer)
    try:
        for table in tables:  # in PERSIA's LRU order: the least recently used first
            store.import_entries(table.dim, table.ids, pyrsia_rows(table, optimizer, adam_step))
        manifest = dump_store(store, output, 0, 1, workers=workers)
    finally:
        store.close()
    return {**manifest, "seconds": time.perf_counter() - started}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="persia-launcher convert-checkpoint",
        description="Convert a PERSIA embedding checkpoint (s<r>/replica_<r>_shard_<i>.emb) into "
        "a Pyrsia checkpoint directory that the PS loads (any number of replicas).",
    )
    p.add_argument(
        "--persia-dir",
        required=True,
        help="the PERSIA checkpoint (holds embedding_dump_done and s0/, s1/, ...)",
    )
    p.add_argument("--output", required=True, help="the Pyrsia checkpoint directory to write")
    p.add_argument(
        "--optimizer",
        required=True,
        help='the embedding optimizer that trained it, as JSON: {"type": "sgd"|"adagrad"|"adam", ...its arguments} (e.g. {"type": "adagrad", "lr": 0.01, "vectorwise_shared": false})',
    )
    p.add_argument(
        "--adam-step",
        type=int,
        default=0,
        help="Adam only: the step each entry's bias correction continues from (PERSIA does not store one; default 0)",
    )
    p.add_argument(
        "--num-workers", type=int, default=4, help="threads writing the files (default 4)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        try:
            raw = json.loads(args.optimizer)
        except ValueError as exc:
            raise InvalidInputError("--optimizer", "JSON", f"{args.optimizer!r} ({exc})") from None
        spec = optimizer_from_dict(raw, "--optimizer")
        if args.adam_step < 0:
            raise InvalidInputError("--adam-step", "an integer >= 0", args.adam_step)
        done = convert(
            args.persia_dir, args.output, spec, adam_step=args.adam_step, workers=args.num_workers
        )
    except InvalidInputError as exc:
        return fail(str(exc))
    print(
        f"wrote {done['entries']} entries ({', '.join(f'dim {d}' for d in done['dims'])}) to "
        f"{args.output} in {done['seconds']:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
