"""CPU per batch of a one-thread PS store by internal shard count: the count a job gets with
``num_hashmap_internal_shards`` unset against the one PERSIA's default (100) gave.

A training lookup and an Adagrad update of every batch, on ``EmbeddingStore`` directly (the
PS's work for one request, without HTTP), dim 16, one thread, stores filled first so no
entry is new. Batch shapes: ``census`` (~600 distinct ids, Census-Income at 1,024 rows)
and ``criteo`` (~15,800, the Criteo-shaped set at 1,024 rows). The stores of every shard
count take their batches in turn within each round, so all see the same machine load; the
thread's CPU time (``time.thread_time``) is read around each call, and each figure is the
median over rounds of the mean per batch. Ends with::

    RESULT unset_cpu_us=... persia_default_cpu_us=... ratio=...

(``census`` shape, lookup + update; ratio = unset / PERSIA's default, lower is better)

    python benchmarks/ps_shards_bench.py [--rounds 9] [--batches 40] [--json PATH]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from _common import print_table, write_json
from plots import bar_chart_from_rows, saved

from pyrsia.services.embedding_ps.capacity import internal_shards
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec

DIM = 16
SHAPES = {"census": 600, "criteo": 15_800}
"""Distinct ids per batch."""
CAPACITY = 4_000_000
PERSIA_DEFAULT = 100


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (median reported)")
    parser.add_argument("--batches", type=int, default=40, help="batches per round and store")
    parser.add_argument("--json", type=Path, help="write the JSON here instead of bench_results/")
    args = parser.parse_args()
    if args.rounds < 1 or args.batches < 1:
        parser.error(f"--rounds, --batches: expected >= 1, got {args.rounds}, {args.batches}")
    return args


def shard_counts() -> dict[str, int]:
    """Label -> internal shards of a one-thread store, as ``embedding_ps.main`` chooses them."""
    return {
        "unset": internal_shards(None, 1, CAPACITY),
        "key 8": internal_shards(8, 1, CAPACITY),
        "PERSIA default (100)": internal_shards(PERSIA_DEFAULT, 1, CAPACITY),
    }


def batches(n_ids: int, count: int, seed: int) -> list[np.ndarray]:
    """``count`` batches of ``n_ids`` distinct ids drawn from a vocabulary of 20x that."""
    rng = np.random.default_rng(seed)
    vocab = np.arange(1, 20 * n_ids + 1, dtype=np.uint64)
    return [rng.choice(vocab, n_ids, replace=False) for _ in range(count)]


def filled_store(shards: int, ids: list[np.ndarray]) -> EmbeddingStore:
    store = EmbeddingStore(CAPACITY, num_shards=shards, optimizer=AdagradSpec(lr=0.01), threads=1)
    for b in ids:
        store.lookup(b, DIM, train=True)
    return store


def timed_round(store: EmbeddingStore, ids: list[np.ndarray], grads: np.ndarray) -> tuple:
    """Mean thread-CPU microseconds per batch of the lookups and of the updates."""
    lookup = update = 0.0
    for b in ids:
        t0 = time.thread_time()
        store.lookup(b, DIM, train=True)
        t1 = time.thread_time()
        store.update(b, grads[: b.shape[0]])
        t2 = time.thread_time()
        lookup, update = lookup + t1 - t0, update + t2 - t1
    return lookup / len(ids) * 1e6, update / len(ids) * 1e6


def measure(shape: str, counts: dict[str, int], rounds: int, n_batches: int) -> list[dict]:
    ids = batches(SHAPES[shape], n_batches, seed=len(shape))
    grads = np.full((SHAPES[shape], DIM), 0.01, dtype=np.float32)
    stores = {label: filled_store(n, ids) for label, n in counts.items()}
    samples: dict[str, list[tuple]] = {label: [] for label in counts}
    for r in range(rounds + 1):
        for label, store in stores.items():
            result = timed_round(store, ids, grads)
            if r:  # round 0 warms every store
                samples[label].append(result)
    rows = []
    base = None
    for label, store in stores.items():
        lookup = statistics.median(s[0] for s in samples[label])
        update = statistics.median(s[1] for s in samples[label])
        total = statistics.median(s[0] + s[1] for s in samples[label])
        base = total if base is None else base
        rows.append(
            {
                "shape": shape,
                "ids": SHAPES[shape],
                "setting": label,
                "shards": counts[label],
                "lookup_us": round(lookup, 1),
                "update_us": round(update, 1),
                "total_us": round(total, 1),
                "vs_unset": round(total / base, 2),
            }
        )
        store.close()
    return rows


def main() -> None:
    args = parse_args()
    counts = shard_counts()
    rows = [row for shape in SHAPES for row in measure(shape, counts, args.rounds, args.batches)]
    print_table(
        rows,
        [
            ("shape", "shape"),
            ("ids", "ids/batch"),
            ("setting", "num_hashmap_internal_shards"),
            ("shards", "shards"),
            ("lookup_us", "lookup CPU us"),
            ("update_us", "update CPU us"),
            ("total_us", "total CPU us"),
            ("vs_unset", "x unset"),
        ],
    )
    census = {r["setting"]: r["total_us"] for r in rows if r["shape"] == "census"}
    unset, persia = census["unset"], census["PERSIA default (100)"]
    path = write_json(
        "ps_shards_bench",
        {"rounds": args.rounds, "batches": args.batches, "dim": DIM, "rows": rows},
        args.json,
    )
    print(f"wrote {path}")
    saved(
        bar_chart_from_rows(
            path,
            [{**r, "label": f"{r['shape']}, {r['shards']} shards"} for r in rows],
            "label",
            {"lookup_us": "lookup", "update_us": "update"},
            title="PS CPU per batch by internal shards (one thread, dim 16, Adagrad)",
            ylabel="CPU us per batch",
            logy=True,
        )
    )
    print(
        f"RESULT unset_cpu_us={unset:.1f} persia_default_cpu_us={persia:.1f} "
        f"ratio={unset / persia:.3f}"
    )


if __name__ == "__main__":
    main()
