"""The model's join of a gathered batch's slots, ``torch.cat([*embedding_tensors, dense],
dim=1)``, as the NN worker hands the slots over (``slot_tensors.SlotTensor``: consecutive
slots joined as the block's columns) against the slot-by-slot join of the same tensors.

Census-Income's shape by default: 33 slots of dim 16, batch 1,024, the bottom MLP's 64 dense
columns. Each call starts with the block out of the caches (64 MB swept before it), as
the training thread finds it after the runtime thread gathered it; ``forward`` is the join,
``forward + backward`` the join and autograd back to each slot's gradient. The two sides
alternate call by call; each figure is the median wall time of one call on torch's default
threads. Ends with::

    RESULT columns_us=... slot_by_slot_us=... ratio=...

(forward + backward; ratio = columns / slot by slot, lower is better)

    python benchmarks/slot_join_bench.py [--calls 300] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from _common import print_table, write_json

from pyrsia.services.nn_worker.slot_tensors import SlotBlock, model_slots, slot_rows
from pyrsia.shared.allocator import keep_freed_memory
from pyrsia.shared.settings import Settings

SLOTS, DIM, BATCH, DENSE = 33, 16, 1024, 64
SWEEP = np.ones(16 << 20, np.float32)  # 64 MB: more than this machine class's caches


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="timed calls per side and phase")
    parser.add_argument("--json", type=Path, help="write the JSON here instead of bench_results/")
    args = parser.parse_args()
    if args.calls < 1:
        parser.error(f"--calls: expected >= 1, got {args.calls}")
    return args


def sides(block: torch.Tensor) -> dict[str, Callable[[], list[torch.Tensor]]]:
    """Side -> a function making the batch's slot tensors as the model gets them."""

    def columns() -> list[torch.Tensor]:
        rows = slot_rows(block)
        return model_slots(SlotBlock(block, rows), rows)

    def slot_by_slot() -> list[torch.Tensor]:
        return list(slot_rows(block))

    return {"columns": columns, "slot by slot": slot_by_slot}


def one_call(make: Callable[[], list[torch.Tensor]], dense: torch.Tensor, backward: bool) -> float:
    slots = make()
    SWEEP.sum()  # the block out of the caches
    t0 = time.perf_counter()
    joined = torch.cat([*slots, dense], dim=1)
    if backward:
        joined.sum().backward()  # each slot's .grad set (slot_tensors.slot_gradient)
    return time.perf_counter() - t0


def measure(calls: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    block = torch.randn(BATCH, SLOTS, DIM, generator=gen)
    dense = torch.randn(BATCH, DENSE, generator=gen)
    makers = sides(block)
    rows = []
    for phase, backward in (("forward", False), ("forward + backward", True)):
        times: dict[str, list[float]] = {side: [] for side in makers}
        for call in range(calls + 5):
            for side, make in makers.items():
                elapsed = one_call(make, dense, backward)
                if call >= 5:  # the first calls warm torch's kernels
                    times[side].append(elapsed)
        base = statistics.median(times["slot by slot"])
        for side, samples in times.items():
            us = statistics.median(samples) * 1e6
            rows.append(
                {
                    "phase": phase,
                    "side": side,
                    "median_us": round(us, 1),
                    "vs_slot_by_slot": round(us / (base * 1e6), 3),
                }
            )
    return rows


def main() -> None:
    args = parse_args()
    print(keep_freed_memory(Settings()))  # as the NN worker runs: freed blocks kept
    rows = measure(args.calls)
    print_table(
        rows,
        [
            ("phase", "phase"),
            ("side", "join"),
            ("median_us", "median us per call"),
            ("vs_slot_by_slot", "x slot by slot"),
        ],
    )
    shape = {"slots": SLOTS, "dim": DIM, "batch": BATCH, "dense": DENSE}
    path = write_json(
        "slot_join_bench",
        {"calls": args.calls, "threads": torch.get_num_threads(), **shape, "rows": rows},
        args.json,
    )
    print(f"wrote {path}")
    both = {r["side"]: r["median_us"] for r in rows if r["phase"] == "forward + backward"}
    columns, slot_by_slot = both["columns"], both["slot by slot"]
    print(
        f"RESULT columns_us={columns:.1f} slot_by_slot_us={slot_by_slot:.1f} "
        f"ratio={columns / slot_by_slot:.3f}"
    )


if __name__ == "__main__":
    main()
