"""How a plain PyTorch process's speed depends on other work sharing its cores.

Trains the e2e benchmark's single-process baseline (``benchmarks/baseline.py``, the
Census-Income DLRM at batch 1,024) at 1 and at 2 torch threads, each alone and beside a
side load that keeps one core busy for ``busy`` ms out of every ``busy + idle`` ms (a
stand-in for what Pyrsia's other processes — embedding worker, PS, data loader, the NN
worker's event-loop thread — use on the same machine: 0.3-0.45 of a core in the e2e runs).
The 2-thread run also goes beside the same load in Linux's SCHED_IDLE class (what
``--cpu-priority background`` does to Pyrsia's services). Also trains two 1-thread
baselines at once (what two NN-worker ranks of one torch thread each would have at best).
Runs are interleaved ``--repeats`` times; the table shows the median samples/s of each
setting and its ratio to the 2-thread baseline alone.

Why it matters: a 2-thread torch step splits every operator over both cores and waits for
the slower half, so a core taken by anything else for a few ms stalls the whole step. On
the 2-core machine of the README this is what keeps a 2-thread NN worker below a 2-thread
baseline that has both cores to itself. Ends with::

    RESULT two_threads_alone=... two_threads_loaded=... two_threads_beside_idle_class=...
           one_thread_alone=... two_processes=...

    python benchmarks/contention_bench.py [--quick] [--repeats 3] [--busy-ms 2] [--idle-ms 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import REPO, write_json
from plots import save_bar_chart, saved

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

from e2e import data as e2e_data  # noqa: E402

SIDE_LOAD = """
import sys, time
sys.path.insert(0, sys.argv[4])
from pyrsia.shared.cpu_priority import apply_cpu_priority
apply_cpu_priority(sys.argv[3])  # as --cpu-priority does to a service
busy, idle = float(sys.argv[1]) / 1e3, float(sys.argv[2]) / 1e3
while True:  # killed by the benchmark
    start = time.perf_counter()
    while time.perf_counter() - start < busy:
        pass
    time.sleep(idle)
"""

TRAIN = """
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/benchmarks", sys.argv[1] + "/benchmarks/e2e"]
import torch
from baseline import array_batches, train_single_process
from e2e import data as e2e_data
from e2e.model import (DENSE_LR, EMBEDDING_DIM, EMBEDDING_LR, INIT_RANGE, INITIAL_ACCUMULATOR,
                       SEED, build_model)
torch.set_num_threads(int(sys.argv[3]))
data = e2e_data.load(sys.argv[2])
steps = int(sys.argv[4]) or None
res = train_single_process(
    array_batches(data["train_cat_ids"], data["train_dense"], data["train_label"], 1024),
    [], slot_sizes=[int(c) for c in data["cardinalities"]], dim=EMBEDDING_DIM,
    model_factory=lambda: build_model(len(data["slot_names"]), data["train_dense"].shape[1]),
    embedding_lr=EMBEDDING_LR, dense_lr=DENSE_LR, initial_accumulator_value=INITIAL_ACCUMULATOR,
    emb_initialization=INIT_RANGE, seed=SEED, max_steps=steps)
print(json.dumps({"samples_per_s": res["samples_per_s"]}))
"""


def train(data: Path, threads: int, steps: int, copies: int = 1) -> list[float]:
    """samples/s of ``copies`` baseline processes started together (``threads`` torch threads)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-c", TRAIN, str(REPO), str(data), str(threads), str(steps)]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env) for _ in range(copies)
    ]
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"baseline process exited {proc.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1])["samples_per_s"])
    return out


def with_side_load(busy_ms: float, idle_ms: float, priority: str, fn, *args) -> Any:
    """``fn(*args)`` while a side load at ``priority`` (normal or background) runs."""
    side = subprocess.Popen(
        [sys.executable, "-c", SIDE_LOAD, str(busy_ms), str(idle_ms), priority, str(REPO)]
    )
    try:
        time.sleep(0.2)
        return fn(*args)
    finally:
        side.kill()
        side.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20 steps, 1 repeat (smoke test)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--busy-ms", type=float, default=2.0, help="side load: busy ms (2)")
    parser.add_argument("--idle-ms", type=float, default=3.0, help="side load: idle ms (3)")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.busy_ms <= 0 or args.idle_ms < 0:
        parser.error("--repeats: expected >= 1; --busy-ms: expected > 0; --idle-ms: expected >= 0")
    repeats, steps = (1, 20) if args.quick else (args.repeats, 0)
    caps = dict(max_train_rows=21 * 1024, max_test_rows=1024) if args.quick else {}
    duty = args.busy_ms / (args.busy_ms + args.idle_ms)
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pyrsia-contention-") as tmp:
        data = e2e_data.prepare("census", Path(tmp) / "census.npz", **caps)
        for _ in range(repeats):
            for threads in (1, 2):
                runs.setdefault(f"{threads}t alone", []).extend(train(data, threads, steps))
                loaded = with_side_load(
                    args.busy_ms, args.idle_ms, "normal", train, data, threads, steps
                )
                runs.setdefault(f"{threads}t beside load", []).extend(loaded)
            if hasattr(os, "SCHED_IDLE"):
                loaded = with_side_load(
                    args.busy_ms, args.idle_ms, "background", train, data, 2, steps
                )
                runs.setdefault("2t beside idle-class load", []).extend(loaded)
            both = train(data, 1, steps, copies=2)
            runs.setdefault("2 x 1t at once (sum)", []).append(sum(both))
    median = {k: statistics.median(v) for k, v in runs.items()}
    ref = median["2t alone"]
    print(
        f"\nside load: {args.busy_ms:g} ms busy / {args.idle_ms:g} ms idle ({duty:.0%} of a core)"
    )
    print(f"{'setting':>22}  {'samples/s':>10}  {'vs 2t alone':>11}  runs")
    for name, value in median.items():
        shown = ", ".join(f"{v / 1e3:.1f}k" for v in runs[name])
        print(f"{name:>22}  {value / 1e3:>9.1f}k  {value / ref:>11.2f}  {shown}")
    doc = {"quick": args.quick, "side_load_duty": duty, "runs": runs, "median": median}
    path = write_json("contention_bench", doc, args.json)
    print(f"\nJSON: {path}")
    saved(
        save_bar_chart(
            path,
            list(median),
            list(median.values()),
            baseline=ref,
            baseline_label="2t alone",
            title=f"Training beside a side load ({duty:.0%} of a core)",
            ylabel="samples/s (median)",
        )
    )
    print(
        f"RESULT two_threads_alone={ref:.1f} two_threads_loaded={median['2t beside load']:.1f} "
        f"two_threads_beside_idle_class={median.get('2t beside idle-class load', float('nan')):.1f} "
        f"one_thread_alone={median['1t alone']:.1f} two_processes={median['2 x 1t at once (sum)']:.1f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
