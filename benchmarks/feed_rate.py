"""Feed-rate benchmark: how many samples/s one NN-worker process can be fed (issue 30).

The DLRM job of ``benchmarks/e2e`` (redis-server, ``--ps-replicas`` embedding PS shards
and ``--ew-replicas`` embedding workers (default one of each; ``--ps-replicas 1,2`` runs
each configuration with 1 and with 2, and the two flags combine), one data loader, one
NN-worker process, all real processes on loopback), with the NN worker's dense step
replaced (``benchmarks/e2e/feed_train.py``):

- ``--dense sleep``: a fixed ``time.sleep(--dense-ms)`` stands in for the GPU; every slot's
  embedding gradient is a fixed tensor of the embedding's shape, so the embedding worker
  and the PS do their real work (routing, pooling, gradient fan-out, Adagrad updates);
  (one torch thread: a GPU job's CPU does no dense math);
- ``--dense cpu``: the real DLRM on the CPU (``--threads`` torch threads), for comparison;
- ``--dense cuda``: the real DLRM on CUDA device 0 (no network needed).

Data: the real Census-Income (KDD) set and the Criteo-shaped synthetic set
(``benchmarks/e2e/data.py``), at each ``--batches`` size (default 1,024 and 8,192). The data
loader sends the training split as many times as it takes for ``--min-steps`` batches.

Measured in the steady window (the steps from 20 % to 80 % of the run: the ramp-up of the
pipeline's queues and the data loader finishing early are outside it):

- samples/s of the NN-worker process;
- CPU ms per batch of the NN-worker process outside the dense step (all its threads, less
  the training thread's dense phases and, for ``cpu``/``cuda``, torch's intra-op threads);
- CPU ms per batch of each service (PS, embedding worker, data loader), from ``/proc``;
- from those, how many NN workers at this rate one embedding-worker core and one PS core
  can feed (``1 / (service CPU s per batch) / (NN-worker batches/s)``; the PS's CPU summed
  over its shards and the embedding workers' over theirs, each replica's kept in the
  JSON). When one PS core or one embedding-worker core is the ceiling, more replicas on
  more cores lift it: compare ``--ps-replicas 1,2,4 --ew-replicas 1,2`` on a machine with
  the cores.

In the same run the 2-thread plain-PyTorch baseline (``benchmarks/baseline.py``, the e2e
benchmark's) trains the same batches (at most ``BASELINE_MAX_STEPS``); each configuration's
ratio is its samples/s over the baseline's at the same batch size (target for ``sleep``:
>= 4).

``--services-ref REF`` runs every configuration a second time with the PS and the embedding
worker of commit ``REF`` (``git archive``, started through ``benchmarks/run_source.py``),
interleaved with the working tree's, and prints their CPU ms per batch side by side
(medians over ``--repeats``): how a change to the services is measured on a shared machine. Prints a table and the JSON
path (with the CPU model), writes a PNG of samples/s per configuration beside the JSON, and
ends with::

    RESULT feed_samples_per_s=... baseline_samples_per_s=... ratio=...

(the first data set's sleep configuration at the first batch size).

    python benchmarks/feed_rate.py [--dense sleep,cpu] [--dense-ms 2] [--batches 1024,8192]
                                   [--datasets census,criteo] [--criteo-rows 200000]
                                   [--min-steps 150] [--max-steps 0] [--repeats N]
                                   [--ps-replicas 1,2] [--ew-replicas 1,2]
                                   [--services-ref REF] [--json F] [--png F]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import REPO, machine_info, write_json

sys.path.insert(0, str(REPO / "benchmarks" / "e2e"))

from baseline import array_batches, train_single_process  # noqa: E402
from e2e import data as e2e_data  # noqa: E402
from e2e.model import (  # noqa: E402  # noqa: E402
    DENSE_LR,
    EMBEDDING_DIM,
    EMBEDDING_LR,
    INIT_RANGE,
    INITIAL_ACCUMULATOR,
    SEED,
    build_model,
)
from e2e.procs import CpuSampler  # noqa: E402
from feed_cli import parse_args  # noqa: E402
from feed_job import run_job  # noqa: E402
from feed_report import compare_trees, plot, print_report  # noqa: E402
from feed_summary import summarize_run  # noqa: E402
from request_cpu_bench import unpack_ref  # noqa: E402

WINDOW = (0.2, 0.8)  # the steady window, as fractions of the run's steps
TARGET_RATIO = 4.0
BASELINE_MAX_STEPS = 150  # ~4 s at batch 1,024: a short run swung 36-47k samples/s on one machine


# ------------------------------------------------------------------------------- one run
def steady_window(steps: int) -> tuple[int, int]:
    """The first and last step (1-based, after the step) of the steady window of ``steps``."""
    lo = max(2, int(WINDOW[0] * steps))  # after the untimed first step
    hi = max(lo + 1, int(WINDOW[1] * steps))
    return lo, min(hi, steps)


def run_feed(
    data_path: Path,
    configs: tuple[Path, Path],
    tmp: Path,
    *,
    dense: str,
    dense_ms: float,
    batch: int,
    steps: int,
    epochs: int,
    threads: int,
    staleness: int,
    services: str = "working tree",
    ps_replicas: int = 1,
    ew_replicas: int = 1,
    source: Path | None = None,
) -> dict[str, Any]:
    """One job through the whole pipeline with ``dense`` as the NN worker's dense step,
    ``ps_replicas`` PS shards and ``ew_replicas`` embedding workers; the PS and the embedding
    worker from ``source`` (a ``git archive`` of ``services``, run by
    ``benchmarks/run_source.py``) or from the working tree (None)."""
    lo, hi = steady_window(steps)
    threads = 1 if dense == "sleep" else threads  # no dense math on the CPU: one torch thread
    result_path = tmp / f"feed-{dense}-{batch}-{time.monotonic_ns()}.json"
    env = {
        "E2E_DATA": str(data_path),
        "E2E_RESULT": str(result_path),
        "E2E_BATCH": str(batch),
        "E2E_THREADS": str(threads),
        "OMP_NUM_THREADS": str(threads),
        "E2E_STALENESS": str(staleness),
        "E2E_MAX_STEPS": str(steps),
        "FEED_EPOCHS": str(epochs),
        "FEED_DENSE": dense,
        "FEED_DENSE_MS": str(dense_ms),
        "FEED_WINDOW": f"{lo},{hi}",
        "PYTHONUNBUFFERED": "1",
    }
    flags = [
        "--embedding-config",
        str(configs[0]),
        "--global-config",
        str(configs[1]),
        "--port",
        "0",
    ]
    sampler = CpuSampler(interval_s=0.1)
    tag = f"{dense}-{batch}-{time.monotonic_ns()}"
    from_source = ["benchmarks.run_source", str(source)] if source is not None else None
    codes = run_job(tmp, tag, env, flags, sampler, from_source, ps_replicas, ew_replicas)
    if any(code != 0 for code in codes.values()) or not result_path.exists():
        tail = (tmp / f"nn-{tag}.log").read_text(errors="replace")[-3000:]
        tail_dl = (tmp / f"dl-{tag}.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(
            f"feed run {tag} failed, exit codes {codes}\n--- nn worker\n{tail}\n"
            f"--- data loader\n{tail_dl}"
        )
    res = json.loads(result_path.read_text())
    out = summarize_run(res, sampler, batch=batch, dense=dense, dense_ms=dense_ms, threads=threads)
    return {"services": services, "ps_replicas": ps_replicas, "ew_replicas": ew_replicas, **out}


# ------------------------------------------------------------------------------- baseline
def run_baseline(data: dict[str, Any], *, batch: int, threads: int, steps: int) -> dict[str, Any]:
    """The plain single-process PyTorch run (``benchmarks/baseline.py``) on the same batches,
    ``threads`` torch threads, no evaluation: samples/s over its timed steps."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        res = train_single_process(
            array_batches(data["train_cat_ids"], data["train_dense"], data["train_label"], batch),
            [],
            slot_sizes=[int(c) for c in data["cardinalities"]],
            dim=EMBEDDING_DIM,
            model_factory=lambda: build_model(
                len(data["slot_names"]), data["train_dense"].shape[1]
            ),
            embedding_lr=EMBEDDING_LR,
            dense_lr=DENSE_LR,
            initial_accumulator_value=INITIAL_ACCUMULATOR,
            emb_initialization=INIT_RANGE,
            seed=SEED,
            max_steps=steps,
        )
    finally:
        torch.set_num_threads(previous)
    return {
        "batch": batch,
        "threads": threads,
        "steps": res["steps"],
        "samples_per_s": res["samples_per_s"],
        "train_seconds": res["train_seconds"],
    }


# ------------------------------------------------------------------------------- report
def bench_dataset(
    name: str, data_path: Path, tmp: Path, args: argparse.Namespace, trees: dict[str, Path | None]
) -> dict:
    """Every (dense, batch) configuration of one data set, ``--repeats`` times with the
    services of each of ``trees`` (interleaved), and the baseline at each batch."""
    data = e2e_data.load(data_path)
    configs = e2e_data.write_configs(data, tmp)
    rows = len(data["train_label"])
    configs_out, baselines = [], {}
    for batch in args.batches:
        per_epoch = math.ceil(rows / batch)
        steps = args.max_steps or max(args.min_steps, per_epoch)
        epochs = math.ceil(steps / per_epoch)
        for dense in args.dense:
            for _ in range(args.repeats):
                for ps_replicas, ew_replicas, (services, source) in itertools.product(
                    args.ps_replicas, args.ew_replicas, trees.items()
                ):
                    print(
                        f"[{name}] feed run: dense {dense}, batch {batch}, {steps} steps, "
                        f"{ps_replicas} PS shard(s), {ew_replicas} embedding worker(s), "
                        f"services of the {services} ...",
                        flush=True,
                    )
                    run = run_feed(
                        data_path,
                        configs,
                        tmp,
                        dense=dense,
                        dense_ms=args.dense_ms,
                        batch=batch,
                        steps=steps,
                        epochs=epochs,
                        threads=args.threads,
                        staleness=args.staleness,
                        services=services,
                        source=source,
                        ps_replicas=ps_replicas,
                        ew_replicas=ew_replicas,
                    )
                    configs_out.append({"dataset": name, **run})
        print(f"[{name}] baseline, batch {batch}, {args.baseline_threads} threads ...", flush=True)
        baselines[batch] = run_baseline(
            data,
            batch=batch,
            threads=args.baseline_threads,
            steps=min(steps, per_epoch, BASELINE_MAX_STEPS),
        )
    for c in configs_out:
        c["baseline_samples_per_s"] = baselines[c["batch"]]["samples_per_s"]
        c["ratio"] = c["samples_per_s"] / c["baseline_samples_per_s"]
    return {
        "dataset": name,
        "train_rows": rows,
        "slots": len(data["slot_names"]),
        "configs": configs_out,
        "baselines": list(baselines.values()),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, __doc__.split("\n\n")[0])
    results = []
    with tempfile.TemporaryDirectory(prefix="pyrsia-feed-") as tmp_name:
        tmp = Path(tmp_name) if args.log_dir is None else args.log_dir
        tmp.mkdir(parents=True, exist_ok=True)
        caps = {"max_train_rows": args.max_train_rows or None, "max_test_rows": 16}
        trees: dict[str, Path | None] = {"working tree": None}
        if args.services_ref:
            ref = unpack_ref(args.services_ref, tmp / "services-ref")
            trees[ref[:10]] = tmp / "services-ref"
        for name in args.datasets:
            path = e2e_data.prepare(name, tmp / f"{name}.npz", criteo_rows=args.criteo_rows, **caps)
            results.append(bench_dataset(name, path, tmp, args, trees))
    compare = compare_trees(results, list(trees)[1]) if len(trees) > 1 else []
    print_report(results, compare)
    doc = {
        "dense_ms": args.dense_ms,
        "threads": args.threads,
        "baseline_threads": args.baseline_threads,
        "staleness": args.staleness,
        "ps_replicas": args.ps_replicas,
        "ew_replicas": args.ew_replicas,
        "target_ratio": TARGET_RATIO,
        "window": WINDOW,
        "repeats": args.repeats,
        "services_ref": list(trees)[1] if len(trees) > 1 else None,
        "services_compare": compare,
        "results": results,
    }
    path = write_json("feed_rate", doc, args.json)
    png = plot(results, args.png or path.with_suffix(".png"))  # None without matplotlib
    print(f"\nmachine: {machine_info()['cpu_model']}, {os.cpu_count()} CPUs")
    print(f"JSON: {path}\nPNG: {png}")
    first = next(
        (c for c in results[0]["configs"] if c["dense"] == "sleep"), results[0]["configs"][0]
    )
    print(
        f"RESULT feed_samples_per_s={first['samples_per_s']:.1f} "
        f"baseline_samples_per_s={first['baseline_samples_per_s']:.1f} ratio={first['ratio']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
