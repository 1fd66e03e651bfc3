"""Per-batch CPU of embedded mode's engine path, phase by phase, without the dense model.

Embedded mode (``persia-launcher run --embedded``) runs the embedding PS and worker engines in
the NN worker's process; on a 2-core machine every CPU-ms they spend per batch comes out of
the training step (docs/guides/scaling.md). This benchmark replays what the engine threads
do for each Census-Income batch of the end-to-end benchmark (1,024 rows, 33 single-id slots,
dim 16, Adagrad), on one thread, and times each phase in thread CPU and wall::

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
also the functions that took the most time. Ends with::

    RESULT engine_cpu_ms_per_batch=... prepare_cpu_ms=... lookup_cpu_ms=... tensors_cpu_ms=... payload_cpu_ms=... gradients_cpu_ms=...

Run: ``.venv/bin/python benchmarks/embedded_engine_bench.py [--batches 150] [--passes 3]
[--profile] [--json F]``. Thread CPU is less disturbed than wall time by other processes on
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
from pyrsia.shared.config import load_embedding_config, load_global_config  # noqa: E402

BATCH = 1024
PHASES = ("build", "prepare", "lookup", "tensors", "backward", "payload", "gradients")
COUNTED = ("build", "prepare", "lookup", "tensors", "payload", "gradients")
"""The engine threads' phases (``backward`` stands in for the model: not counted)."""
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


async def measure(data: dict, configs: tuple[Path, Path], args: argparse.Namespace) -> list[Timer]:
    """A warm-up pass, then ``args.passes`` timed passes over ``args.batches`` batches."""
    client = EmbeddedClient(load_embedding_config(configs[0]), load_global_config(configs[1]))
    try:
        await client.register_optimizer(ADAGRAD)
        starts = [i * BATCH for i in range(args.batches)]
        batch_id = 0
        for start in starts:
            await one_batch(client, data, start, batch_id)
            batch_id += 1
        profiler = cProfile.Profile() if args.profile else None
        timers = []
        for _ in range(args.passes):
            if profiler is not None:
                profiler.enable()
            for start in starts:
                timers.append(await one_batch(client, data, start, batch_id))
                batch_id += 1
            if profiler is not None:
                profiler.disable()
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return timers
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=150, help="batches per pass (default 150)")
    parser.add_argument("--passes", type=int, default=3, help="timed passes (default 3)")
    parser.add_argument("--profile", action="store_true", help="cProfile the timed passes")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    if args.batches < 1 or args.passes < 1:
        parser.error("--batches, --passes: expected >= 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pyrsia-engine-") as tmp:
        path = e2e_data.prepare(
            "census", Path(tmp) / "census.npz", max_train_rows=args.batches * BATCH
        )
        data = e2e_data.load(path)
        if len(data["train_label"]) < args.batches * BATCH:
            parser.error(
                f"--batches: the Census train split holds {len(data['train_label']) // BATCH}"
            )
        timers = asyncio.run(measure(data, e2e_data.write_configs(data, tmp), args))
    rows = [
        {
            "phase": p,
            "cpu_ms": statistics.median(t.cpu[p] for t in timers) * 1e3,
            "wall_ms": statistics.median(t.wall[p] for t in timers) * 1e3,
        }
        for p in PHASES
    ]
    cpu = {r["phase"]: r["cpu_ms"] for r in rows}
    total = sum(cpu[p] for p in COUNTED)
    print_table(
        [
            {
                "phase": r["phase"] + ("" if r["phase"] in COUNTED else " (not counted)"),
                "cpu_ms": f"{r['cpu_ms']:.3f}",
                "wall_ms": f"{r['wall_ms']:.3f}",
            }
            for r in rows
        ],
        [("phase", "phase"), ("cpu_ms", "CPU ms/batch (median)"), ("wall_ms", "wall ms/batch")],
    )
    path = write_json(
        "embedded_engine_bench",
        {"phases": rows, "batches": args.batches, "passes": args.passes, "cpu": cpu_model()},
        args.json,
    )
    print(f"\nJSON: {path}\nCPU: {cpu_model()}")
    print(
        f"RESULT engine_cpu_ms_per_batch={total:.3f} prepare_cpu_ms={cpu['prepare']:.3f} "
        f"lookup_cpu_ms={cpu['lookup']:.3f} tensors_cpu_ms={cpu['tensors']:.3f} "
        f"payload_cpu_ms={cpu['payload']:.3f} gradients_cpu_ms={cpu['gradients']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
