"""Benchmark of the embedding worker's numeric core on Criteo-shaped batches (no HTTP).

Times, per batch of 4,096 samples x 26 single-id slots (dim 16, Zipf(1.1) ids over
10M per slot, 2 PS replicas): ``IDPart.from_wire`` + ``prepare_batch`` (the one validation, prefix, dedup, routing),
the per-replica payload helpers, ``pool_forward`` and ``pool_backward``, on one
core. Also compares scatter-add strategies for the backward pass and the two
farmhash64 implementations. Prints a table and JSON and ends with one line::

    RESULT ew_core_ms_per_batch=... ew_core_samples_per_s=... ew_core_min_ms_per_batch=...

(medians; the min is the uncontended cost when other processes share the cores)

Run: ``.venv/bin/python benchmarks/ew_core_bench.py [--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pyrsia.services.embedding_worker.pooling import pool_backward, pool_forward
from pyrsia.services.embedding_worker.preprocess import prepare_batch
from pyrsia.services.embedding_worker.routing import (
    replica_lookups,
    replica_updates,
    scatter_responses,
)
from pyrsia.shared.config import EmbeddingSchema, SlotConfig
from pyrsia.shared.farmhash import farmhash64, farmhash64_numpy
from pyrsia.shared.wire.batch import IDPart

BATCH = 4096
SLOTS = 26
DIM = 16
ID_SPACE = 10_000_000
ZIPF_A = 1.1
REPLICAS = 2


def zipf_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """Zipf(1.1) ranks below ID_SPACE (rejection sampling), as uint64 ids."""
    out = np.empty(0, dtype=np.int64)
    while out.shape[0] < n:
        z = rng.zipf(ZIPF_A, size=2 * n)
        out = np.concatenate([out, z[z <= ID_SPACE] - 1])
    return out[:n].astype(np.uint64)


def make_batches(count: int, seed: int = 0) -> list[dict]:
    """Id halves of batches in wire form (what a data loader POSTs to /batch)."""
    rng = np.random.default_rng(seed)
    offsets = np.arange(BATCH + 1, dtype=np.int64)
    return [
        {
            "batch_size": BATCH,
            "requires_grad": True,
            "id_type_features": [
                {"name": f"slot_{s}", "ids": zipf_ids(rng, BATCH), "offsets": offsets}
                for s in range(SLOTS)
            ],
        }
        for _ in range(count)
    ]


def prepare(schema: EmbeddingSchema, wire: dict):
    """What /batch does: check the id half once (IDPart.from_wire), then preprocess it."""
    return prepare_batch(schema, IDPart.from_wire(wire, "batch").id_type_features, REPLICAS)


def timeit(fn: Callable[[int], object], repeats: int) -> dict[str, float]:
    fn(0)  # warm-up (numba compile or cache load)
    times = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    arr = np.array(times) * 1e3
    return {
        "min_ms": float(arr.min()),
        "median_ms": float(np.median(arr)),
        "p90_ms": float(np.percentile(arr, 90)),
    }


def scatter_variants(prepared, grads, repeats: int) -> dict[str, dict[str, float]]:
    """Scatter-add of one dim group's occurrence gradients: numba kernel vs numpy/torch."""
    n_unique = prepared.groups[DIM].ids.shape[0]
    inverse = np.concatenate([p.inverse for p in prepared.slots])
    # single-id slots: occurrence o of a slot is sample o, so its gradient row is g[o]
    occ = np.concatenate(
        [g[: p.inverse.shape[0]] for p, g in zip(prepared.slots, grads, strict=True)]
    )

    def add_at(_: int) -> object:
        out = np.zeros((n_unique, DIM), np.float32)
        np.add.at(out, inverse, occ)
        return out

    def sort_reduceat(_: int) -> object:
        order = np.argsort(inverse, kind="stable")
        keys = inverse[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        out = np.zeros((n_unique, DIM), np.float32)
        out[keys[starts]] = np.add.reduceat(occ[order], starts, axis=0)
        return out

    t_inv, t_occ = torch.from_numpy(inverse), torch.from_numpy(occ)

    def index_add(_: int) -> object:
        out = torch.zeros((n_unique, DIM), dtype=torch.float32)
        return out.index_add_(0, t_inv, t_occ)

    def kernel(_: int) -> object:
        return pool_backward(prepared, grads, 1.0)

    return {
        "numba pool_backward (26 slots)": timeit(kernel, repeats),
        "np.add.at (gathered rows)": timeit(add_at, max(3, repeats // 5)),
        "argsort + np.add.reduceat": timeit(sort_reduceat, repeats),
        "torch index_add_": timeit(index_add, repeats),
    }


def stage_inputs(schema: EmbeddingSchema, batches: list[dict]) -> dict[str, Any]:
    """The prepared batches and what each later stage eats (looked-up vectors, the replicas'
    answers, the slots' gradients and their per-dim sums), made once, outside the timings."""
    prepared = [prepare(schema, b) for b in batches]
    rng = np.random.default_rng(1)
    vectors = [
        {DIM: rng.standard_normal((p.groups[DIM].ids.shape[0], DIM)).astype(np.float32)}
        for p in prepared
    ]
    answers = [
        [[vectors[i][DIM][p.groups[DIM].replica_slice(k)]] for k in range(REPLICAS)]
        for i, p in enumerate(prepared)
    ]
    grads = [[rng.standard_normal((BATCH, DIM)).astype(np.float32)] * SLOTS for _ in prepared]
    grads_by_dim = [pool_backward(p, g, 1.0)[0] for p, g in zip(prepared, grads, strict=True)]
    return {
        "prepared": prepared,
        "vectors": vectors,
        "answers": answers,
        "grads": grads,
        "grads_by_dim": grads_by_dim,
    }


def core_stages(
    schema: EmbeddingSchema, batches: list[dict], inputs: dict[str, Any]
) -> dict[str, Callable[[int], object]]:
    """The worker core's stages, each a callable of the round number (batch ``i % 8``)."""
    nb = len(batches)
    prepared, vectors, answers = inputs["prepared"], inputs["vectors"], inputs["answers"]
    grads, grads_by_dim = inputs["grads"], inputs["grads_by_dim"]
    return {
        "prepare_batch": lambda i: prepare(schema, batches[i % nb]),
        "replica_lookups": lambda i: replica_lookups(prepared[i % nb]),
        "scatter_responses": lambda i: scatter_responses(prepared[i % nb], answers[i % nb]),
        "pool_forward": lambda i: pool_forward(prepared[i % nb], vectors[i % nb]),
        "pool_backward": lambda i: pool_backward(prepared[i % nb], grads[i % nb], 1024.0),
        "replica_updates": lambda i: replica_updates(prepared[i % nb], grads_by_dim[i % nb]),
    }


def print_timings(
    timings: dict[str, dict[str, float]],
    unique: float,
    ids_per_batch: int,
    total_min_ms: float,
    total_ms: float,
) -> None:
    """The table of every timing (stages, hashes, scatter variants) and the core's total."""
    print(
        f"embedding worker core: {BATCH} samples x {SLOTS} slots, dim {DIM}, Zipf({ZIPF_A}) "
        f"over {ID_SPACE:,}, {REPLICAS} replicas; {unique:,.0f} unique ids / {ids_per_batch:,}"
    )
    print(f"{'stage':<34}{'min ms':>9}{'median ms':>11}{'p90 ms':>9}")
    for name, r in timings.items():
        print(f"{name:<34}{r['min_ms']:>9.3f}{r['median_ms']:>11.3f}{r['p90_ms']:>9.3f}")
    print(f"{'core total (sum)':<34}{total_min_ms:>9.3f}{total_ms:>11.3f}")
    print(f"load average during the run: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def build_report(
    results: dict,
    hashes: dict,
    scatter: dict,
    unique: float,
    ids_per_batch: int,
    total_ms: float,
    total_min_ms: float,
) -> dict[str, Any]:
    """The JSON report: the machine, the batch's shape, every timing and the core's rates."""
    return {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "shape": {
            "batch": BATCH,
            "slots": SLOTS,
            "dim": DIM,
            "id_space": ID_SPACE,
            "zipf_a": ZIPF_A,
            "replicas": REPLICAS,
            "unique_ids_per_batch": unique,
        },
        "stages": results,
        "farmhash_ns_per_id": {k: v["median_ms"] * 1e6 / ids_per_batch for k, v in hashes.items()},
        "scatter_variants": scatter,
        "core_ms_per_batch": total_ms,
        "core_samples_per_s": BATCH / (total_ms / 1e3),
        "core_min_ms_per_batch": total_min_ms,
        "core_min_samples_per_s": BATCH / (total_min_ms / 1e3),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default="", help="also write the JSON report to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)

    schema = EmbeddingSchema(slots_config=tuple(SlotConfig(f"slot_{s}", DIM) for s in range(SLOTS)))
    batches = make_batches(8)
    inputs = stage_inputs(schema, batches)
    prepared, grads = inputs["prepared"], inputs["grads"]
    stages = core_stages(schema, batches, inputs)
    results = {name: timeit(fn, args.repeats) for name, fn in stages.items()}
    total_ms = sum(r["median_ms"] for r in results.values())
    total_min_ms = sum(r["min_ms"] for r in results.values())
    ids_per_batch = BATCH * SLOTS
    unique = float(np.mean([p.num_unique_ids for p in prepared]))

    x = np.random.default_rng(2).integers(0, 2**63, size=ids_per_batch, dtype=np.uint64)
    hashes = {
        "farmhash64 numba": timeit(lambda _: farmhash64(x), args.repeats),
        "farmhash64 numpy": timeit(lambda _: farmhash64_numpy(x), args.repeats),
    }
    scatter = scatter_variants(prepared[0], grads[0], args.repeats)

    print_timings({**results, **hashes, **scatter}, unique, ids_per_batch, total_min_ms, total_ms)
    report = build_report(results, hashes, scatter, unique, ids_per_batch, total_ms, total_min_ms)
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    print(
        f"RESULT ew_core_ms_per_batch={total_ms:.3f} "
        f"ew_core_samples_per_s={report['core_samples_per_s']:.0f} "
        f"ew_core_min_ms_per_batch={total_min_ms:.3f}"
    )


if __name__ == "__main__":
    main()
