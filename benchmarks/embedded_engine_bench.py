"""Per-batch CPU of embedded mode's engine path, phase by phase, without the dense model.

Embedded mode (``persia-launcher run --embedded``) runs the embedding PS and worker engines in
the NN worker's process; on a 2-core machine every CPU-ms they spend per batch comes out of
the training step (docs/guides/scaling.md). This benchmark replays what the engine threads
do for each Census-Income batch of the end-to-end benchmark (1,024 rows, 33 single-id slots,
dim 16, Adagrad), on one thread, and times each phase in thread CPU and wall, for each of
embedded mode's two engine paths (``--paths``; one engine each, batch by batch in turn):
``fast`` (pyrsia/services/embedded/fast_path.py, what embedded mode runs) and ``general``
(the route objects, the worker and its PS client, as services mode's routes run them)::

    build     the data loader's PersiaBatch (benchmarks/e2e/data.py)     data loader thread
    prepare   Worker.prepare: prefix, dedup (kernels.dedup_prefixed)     data loader thread
    lookup    EmbeddedClient.lookup, gathered (PS hash probe, LRU)       runtime thread
    tensors   features.build_tensors: the table gathered into slots      runtime thread
    payload   features.gradient_payload: gradients summed per unique id  runtime thread
    gradients EmbeddedClient.gradients (checks, loss scale, Adagrad)     runtime thread

(``backward``, a ``(torch.cat(slots) * weights).sum().backward()`` standing in for the
model, leaves each slot's gradient where the model's would be, a view of the concatenation's
gradient; it is timed but not counted.) The first pass over the batches warms the store
and the kernels; the medians of the next ``--passes`` passes are reported, with ``--profile``
also the functions that took the most time. The table gives each path's phases and
totals, a line the ratio of the totals; the RESULT line is the first path's::

    RESULT engine_cpu_ms_per_batch=... prepare_cpu_ms=... lookup_cpu_ms=... tensors_cpu_ms=... payload_cpu_ms=... gradients_cpu_ms=...

Run: ``.venv/bin/python benchmarks/embedded_engine_bench.py [--batches 150] [--passes 3]
[--paths fast,general] [--profile] [--json F]``. The process keeps freed heap memory as
``TrainCtx`` does (``pyrsia/shared/allocator.py``), so its 2 MB arrays are not faulted in
anew each batch. Thread CPU is less disturbed than wall time by other processes on
the machine, but still compare runs made side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import REPO, cpu_model, print_table, write_json

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

import torch  # noqa: E402
from e2e import data as e2e_data  # noqa: E402
from e2e.model import ADAGRAD_EPS, EMBEDDING_LR, INITIAL_ACCUMULATOR  # noqa: E402

from pyrsia.services.embedded.client import EmbeddedClient  # noqa: E402
from pyrsia.services.nn_worker.features import build_tensors, gradient_payload  # noqa: E402
from pyrsia.shared.allocator import keep_freed_memory  # noqa: E402
from pyrsia.shared.config import load_embedding_config, load_global_config  # noqa: E402
from pyrsia.shared.settings import Settings  # noqa: E402

BATCH = 1024
PHASES = ("build", "prepare", "lookup", "tensors", "backward", "payload", "gradients")
COUNTED = ("build", "prepare", "lookup", "tensors", "payload", "gradients")
"""The engine threads' phases (``backward`` stands in for the model: not counted)."""
PATHS = ("fast", "general")
"""Embedded mode's fast path (``pyrsia/services/embedded/fast_path.py``) and its general one."""
ADAGRAD = {
    "type": "adagrad",
    "lr": EMBEDDING_LR,
    "initial_accumulator_value": INITIAL_ACCUMULATOR,
    "eps": ADAGRAD_EPS,
    "g_square_momentum": 1.0,
    "vectorwise_shared": False,
}


class Timer:
    """Thread-CPU and wall seconds of each phase of the current batch."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self.wall: dict[str, float] = {}

    def run(self, phase: str, fn: Callable[[], Any]) -> Any:
        c, w = time.thread_time(), time.perf_counter()
        out = fn()
        self.cpu[phase] = time.thread_time() - c
        self.wall[phase] = time.perf_counter() - w
        return out


async def one_batch(client: EmbeddedClient, data: dict, start: int, batch_id: int) -> Timer:
    """Every phase of the engine path for the rows ``start:start + BATCH`` of the train split."""
    t = Timer()
    rows = {k: data[k] for k in ("slot_names",)}
    for key in ("train_cat_ids", "train_dense", "train_label"):
        rows[key] = data[key][start : start + BATCH]
    batch = t.run("build", lambda: next(e2e_data.persia_batches(rows, "train", BATCH)))
    worker = client.worker
    t.run("prepare", lambda: worker.forward.put(batch_id, 0, worker.prepare(batch)))
    c, w = time.thread_time(), time.perf_counter()
    answer, _ = await client.lookup(0, batch_id, True, BATCH, gathered=True)
    t.cpu["lookup"], t.wall["lookup"] = time.thread_time() - c, time.perf_counter() - w
    embeddings = answer.embeddings
    dense = [batch.non_id_type_features[0].data]
    labels = [batch.labels[0].data]
    tensors = t.run("tensors", lambda: build_tensors(dense, labels, embeddings, requires_grad=True))
    slots = [tensor for _, tensor in tensors.embeddings]
    weights = torch.full((BATCH, sum(s.shape[1] for s in slots)), 1e-3)
    # the model's concatenation: each slot's gradient a view of one (batch, width) gradient
    t.run("backward", lambda: (torch.cat(slots, dim=1) * weights).sum().backward())
    payload = t.run("payload", lambda: gradient_payload(tensors.embeddings, embeddings.tables))
    c, w = time.thread_time(), time.perf_counter()
    await client.gradients(
        0,
        batch_id,
        1.0,
        payload.slots,
        tables=payload.tables,
        skipped_slots=payload.skipped_slots,
    )
    t.cpu["gradients"], t.wall["gradients"] = time.thread_time() - c, time.perf_counter() - w
    return t


async def measure(
    data: dict, configs: tuple[Path, Path], args: argparse.Namespace
) -> dict[str, list[Timer]]:
    """A warm-up pass, then ``args.passes`` timed passes over ``args.batches`` batches, for
    each of ``args.paths`` (one engine each), batch by batch in turn."""
    clients = {
        path: EmbeddedClient(
            load_embedding_config(configs[0]),
            load_global_config(configs[1]),
            fast_path=path == "fast",
        )
        for path in args.paths
    }
    try:
        for client in clients.values():
            await client.register_optimizer(ADAGRAD)
        starts = [i * BATCH for i in range(args.batches)]
        batch_id = 0
        for start in starts:
            for client in clients.values():
                await one_batch(client, data, start, batch_id)
            batch_id += 1
        profiler = cProfile.Profile() if args.profile else None
        timers: dict[str, list[Timer]] = {path: [] for path in clients}
        for _ in range(args.passes):
            for start in starts:
                for path, client in clients.items():
                    if profiler is not None:
                        profiler.enable()
                    timers[path].append(await one_batch(client, data, start, batch_id))
                    if profiler is not None:
                        profiler.disable()
                batch_id += 1
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return timers
    finally:
        for client in clients.values():
            client.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=150, help="batches per pass (default 150)")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (default 3)")
    parser.add_argument(
        "--paths",
        type=lambda v: tuple(p.strip() for p in v.split(",") if p.strip()),
        default=PATHS,
        help="engine paths to measure, batch by batch in turn: fast, general (default both)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the timed passes")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.passes < 1:
        parser.error("--batches, --passes: expected >= 1")
    if (
        not args.paths
        or any(p not in PATHS for p in args.paths)
        or len(set(args.paths)) < len(args.paths)
    ):
        parser.error(f"--paths: expected distinct names from {', '.join(PATHS)}")
    args.error = parser.error
    return args


def report(timers: dict[str, list[Timer]], args: argparse.Namespace) -> None:
    """The table, the JSON and the RESULT line (the first path's)."""
    rows = [
        {
            "phase": p,
            **{
                f"{path}_{kind}": statistics.median(getattr(t, kind)[p] for t in timers[path]) * 1e3
                for path in args.paths
                for kind in ("cpu", "wall")
            },
        }
        for p in PHASES
    ]
    totals = {
        path: sum(r[f"{path}_cpu"] for r in rows if r["phase"] in COUNTED) for path in args.paths
    }
    columns = [("phase", "phase")]
    for path in args.paths:
        columns += [(f"{path}_cpu", f"{path}: CPU ms/batch"), (f"{path}_wall", f"{path}: wall ms")]
    print_table(
        [
            {
                "phase": r["phase"] + ("" if r["phase"] in COUNTED else " (not counted)"),
                **{k: f"{v:.3f}" for k, v in r.items() if k != "phase"},
            }
            for r in rows
        ]
        + [{"phase": "engine total", **{f"{p}_cpu": f"{t:.3f}" for p, t in totals.items()}}],
        columns,
    )
    meta = {"batches": args.batches, "passes": args.passes, "cpu": cpu_model()}
    path = write_json(
        "embedded_engine_bench", {"phases": rows, "totals_cpu_ms": totals, **meta}, args.json
    )
    print(f"\nJSON: {path}\nCPU: {cpu_model()}")
    first = args.paths[0]
    cpu = {r["phase"]: r[f"{first}_cpu"] for r in rows}
    for other in args.paths[1:]:
        print(f"engine CPU per batch, {first} / {other}: {totals[first] / totals[other]:.3f}")
    print(
        f"RESULT engine_cpu_ms_per_batch={totals[first]:.3f} "
        f"prepare_cpu_ms={cpu['prepare']:.3f} lookup_cpu_ms={cpu['lookup']:.3f} "
        f"tensors_cpu_ms={cpu['tensors']:.3f} payload_cpu_ms={cpu['payload']:.3f} "
        f"gradients_cpu_ms={cpu['gradients']:.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    # as TrainCtx does: the 2 MB blocks come from the heap, not fresh pages
    keep_freed_memory(Settings.from_env())
    with tempfile.TemporaryDirectory(prefix="pyrsia-engine-") as tmp:
        path = e2e_data.prepare(
            "census", Path(tmp) / "census.npz", max_train_rows=args.batches * BATCH
        )
        data = e2e_data.load(path)
        if len(data["train_label"]) < args.batches * BATCH:
            args.error(
                f"--batches: the Census train split holds {len(data['train_label']) // BATCH}"
            )
        timers = asyncio.run(measure(data, e2e_data.write_configs(data, tmp), args))
    report(timers, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
