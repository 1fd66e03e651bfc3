"""In-process benchmark of the embedding PS storage engine (the engine half of ``ps_bench.py``).

Workload: ids drawn from Zipf(1.1) over ``n_distinct`` ids, deduplicated per batch as the
embedding worker does, against a store pre-filled with all ``n_distinct`` entries (capacity =
``n_distinct``). Measures training lookups, eval lookups and optimizer updates in ids/s on one
thread, memory per entry against raw (8-byte key + embedding + optimizer state), and the numba
first-call time with a cold and a warm compilation cache.

    python benchmarks/ps_bench_engine.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import fmt_rate, print_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pyrsia.services.embedding_ps.engine import EmbeddingStore  # noqa: E402
from pyrsia.services.embedding_ps.table import shard_of  # noqa: E402
from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, EmbeddingHyperparams, SGDSpec  # noqa: E402

OPTIMIZERS = {"adagrad": AdagradSpec(), "sgd": SGDSpec(0.01), "adam": AdamSpec()}


def rank_to_id(ranks: np.ndarray) -> np.ndarray:
    """Spread Zipf ranks over the uint64 space (a bijection), as real feature ids are."""
    x = ranks.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def zipf_batches(
    n_distinct: int, batch: int, count: int, a: float = 1.1, seed: int = 0, unique: bool = False
) -> list[np.ndarray]:
    """``count`` batches of ``batch`` ids drawn Zipf(a) over ``n_distinct`` ranks; with ``unique``,
    ``batch`` distinct ids per batch (what the PS receives after the worker's deduplication)."""
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, n_distinct + 1, dtype=np.float64) ** a)
    cdf /= cdf[-1]
    out = []
    for _ in range(count):
        if not unique:
            out.append(rank_to_id(np.searchsorted(cdf, rng.random(batch))))
            continue
        seen = np.empty(0, dtype=np.int64)
        while seen.shape[0] < batch:
            draw = np.searchsorted(cdf, rng.random(batch * 4))
            seen = np.unique(np.concatenate([seen, draw]))
        picked = rng.permutation(seen)[:batch]
        out.append(rank_to_id(picked))
    return out


def _prefill(
    n_distinct: int, dim: int, optimizer: str, num_shards: int
) -> tuple[EmbeddingStore, float]:
    store = EmbeddingStore(
        n_distinct,
        num_shards=num_shards,
        hyperparams=EmbeddingHyperparams(),
        optimizer=OPTIMIZERS[optimizer],
    )
    t0 = time.perf_counter()
    step = 1 << 20
    for start in range(0, n_distinct, step):
        store.lookup(rank_to_id(np.arange(start, min(n_distinct, start + step))), dim, train=True)
    return store, time.perf_counter() - t0


def _rate(
    fn, batches: list[np.ndarray], cpu: dict[str, float] | None = None, name: str = ""
) -> float:
    """ids/s of ``fn`` over ``batches`` (wall clock); with ``cpu``, also the process's CPU ns
    per id (every thread's) as ``cpu[name]``."""
    fn(batches[0])  # warm-up (page faults, caches)
    c0, t0 = time.process_time(), time.perf_counter()
    for b in batches:
        fn(b)
    ids = sum(b.shape[0] for b in batches)
    if cpu is not None:
        cpu[name] = 1e9 * (time.process_time() - c0) / ids
    return ids / (time.perf_counter() - t0)


def run_engine_bench(
    n_distinct: int,
    dim: int,
    batch: int,
    *,
    optimizer: str = "adagrad",
    num_shards: int = 1,
    steps: int = 20,
    seed: int = 0,
    unique: bool = False,
    store: EmbeddingStore | None = None,
) -> dict:
    """Measure one configuration; pass a pre-filled ``store`` (same n_distinct, dim) to reuse it."""
    fill_s = None
    if store is None:
        store, fill_s = _prefill(n_distinct, dim, optimizer, num_shards)
    batches = zipf_batches(n_distinct, batch, steps, seed=seed, unique=unique)
    grads = np.random.default_rng(seed).normal(scale=1e-3, size=(batch, dim)).astype(np.float32)
    cpu: dict[str, float] = {}
    train = _rate(lambda b: store.lookup(b, dim, train=True), batches, cpu, "train_lookup")
    evals = _rate(lambda b: store.lookup(b, dim, train=False), batches, cpu, "eval_lookup")
    update = _rate(lambda b: store.update(b, grads[: b.shape[0]]), batches, cpu, "update")
    s = store.stats()
    assert s["entries"] == n_distinct and s["evictions"] == 0 and s["skipped_unknown"] == 0
    return {
        "n_distinct": n_distinct,
        "dim": dim,
        "batch": batch,
        "optimizer": optimizer,
        "num_shards": num_shards,
        "unique_ids_per_batch": unique,
        "train_lookup_ids_per_s": train,
        "eval_lookup_ids_per_s": evals,
        "update_ids_per_s": update,
        **{f"{k}_cpu_ns_per_id": v for k, v in cpu.items()},
        "bytes_per_entry": s["bytes_per_entry"],
        "raw_bytes_per_entry": s["raw_bytes_per_entry"],
        "bytes_per_entry_ratio": s["bytes_per_entry"] / s["raw_bytes_per_entry"],
        "prefill_s": fill_s,
    }


# ------------------------------------------------------------------------ ps_bench's grid
def prefill_store(
    n: int, dim: int, num_shards: int = 1, threads: int = 1
) -> tuple[EmbeddingStore, float]:
    """An Adagrad store of ``num_shards`` internal shards worked by ``threads`` threads,
    holding exactly the ``n`` ids the Zipf ranks map to (its capacity: the fullest shard's
    count times the shards, so no shard evicts)."""
    fullest = np.bincount(shard_of(rank_to_id(np.arange(n)), num_shards)).max()
    store = EmbeddingStore(
        int(fullest) * num_shards,
        num_shards,
        EmbeddingHyperparams(),
        OPTIMIZERS["adagrad"],
        threads=threads,
    )
    t0 = time.perf_counter()
    for start in range(0, n, 1 << 20):
        store.lookup(rank_to_id(np.arange(start, min(n, start + (1 << 20)))), dim, train=True)
    return store, time.perf_counter() - t0


def engine_grid(
    sizes, dims, batches, steps: int, repeats: int, threads: tuple[int, ...] = (1,)
) -> list[dict[str, Any]]:
    """One row per (n, dim, batch, thread count): medians over ``repeats`` rounds. With several
    thread counts every store has ``max(threads)`` internal shards, and each round measures
    every count in turn (side by side on a shared machine)."""
    rows = []
    shards = max(threads)
    for n in sizes:
        for dim in dims:
            stores = {t: prefill_store(n, dim, shards, t) for t in threads}
            for batch in batches:
                runs: dict[int, list] = {t: [] for t in threads}
                for r in range(repeats):
                    for t in threads:
                        runs[t].append(
                            run_engine_bench(n, dim, batch, steps=steps, seed=r, store=stores[t][0])
                        )
                for t in threads:
                    rows.append(_engine_row(n, dim, batch, t, shards, stores[t][1], runs[t]))
            for store, _ in stores.values():
                store.close()
            del stores
            gc.collect()
    return rows


def _engine_row(
    n: int,
    dim: int,
    batch: int,
    threads: int,
    shards: int,
    fill_s: float,
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    row = {
        "part": "engine",
        "n": n,
        "dim": dim,
        "batch": batch,
        "threads": threads,
        "num_shards": shards,
        "prefill_s": fill_s,
    }
    for key in (
        "train_lookup_ids_per_s",
        "eval_lookup_ids_per_s",
        "update_ids_per_s",
        "train_lookup_cpu_ns_per_id",
        "update_cpu_ns_per_id",
    ):
        vals = [r[key] for r in runs]
        row[key] = statistics.median(vals)
        row[key + "_minmax"] = (min(vals), max(vals))
    for key in ("bytes_per_entry", "raw_bytes_per_entry", "bytes_per_entry_ratio"):
        row[key] = runs[-1][key]
    print(
        f"  engine n={n} dim={dim} batch={batch} threads={threads}: lookup {fmt_rate(row['train_lookup_ids_per_s'])}/s "
        f"update {fmt_rate(row['update_ids_per_s'])}/s ratio {row['bytes_per_entry_ratio']:.3f}",
        flush=True,
    )
    return row


def print_threads(engine: list[dict[str, Any]], threads: tuple[int, ...]) -> None:
    """With several thread counts: each count's rates and their ratio to the first count's."""
    if len(threads) < 2:
        return
    by = {(r["n"], r["dim"], r["batch"], r["threads"]): r for r in engine}
    table = []
    for n, dim, batch in sorted({k[:3] for k in by}):
        base = by[(n, dim, batch, threads[0])]
        for t in threads:
            r = by[(n, dim, batch, t)]
            row = {"n": n, "dim": dim, "batch": batch, "threads": t, "shards": r["num_shards"]}
            for key, name in (
                ("train_lookup_ids_per_s", "lookup"),
                ("update_ids_per_s", "adagrad"),
                ("eval_lookup_ids_per_s", "eval"),
            ):
                row[name] = f"{fmt_rate(r[key])} ({r[key] / base[key]:.2f}x)"
            for key, name in (
                ("train_lookup_cpu_ns_per_id", "lookup CPU ns/id"),
                ("update_cpu_ns_per_id", "adagrad CPU ns/id"),
            ):
                row[name] = f"{r[key]:.0f}"
            table.append(row)
    print(
        f"engine by thread count (wall-clock ids/s and their ratio to {threads[0]} thread(s); "
        "CPU ns per id summed over threads; stores of the same shard count):"
    )
    print_table(table, [(k, k) for k in table[0]])


_FIRST_CALL = """
import time, numpy as np
t0 = time.perf_counter()
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec
t1 = time.perf_counter()
s = EmbeddingStore(100, optimizer=AdagradSpec())
ids = np.arange(10, dtype=np.uint64)
s.lookup(ids, 8, train=True); s.lookup(ids, 8, train=False)
s.update(ids, np.ones((10, 8), np.float32)); s.export_entries(); s.export_entries(ids)
s.import_entries(8, ids, s.export_entries()[8][1])
print(t1 - t0, time.perf_counter() - t1)
"""


def first_call_seconds(cold: bool) -> dict:
    """Import and first-call time of the engine in a fresh process (cold: empty numba cache)."""
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        if cold:
            env["NUMBA_CACHE_DIR"] = tmp
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(
            [sys.executable, "-c", _FIRST_CALL],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
    imp, first = (float(x) for x in out.stdout.split())
    return {"import_s": imp, "first_calls_s": first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1M distinct only")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    compile_info = {"cold": first_call_seconds(cold=True), "warm": first_call_seconds(cold=False)}
    sizes = [1_000_000] if args.quick else [1_000_000, 10_000_000]
    results = []
    for n in sizes:
        for dim in (16, 64):
            store, fill = _prefill(n, dim, "adagrad", args.shards)
            for batch in (4096, 65536):
                for unique in (False, True):
                    r = run_engine_bench(
                        n,
                        dim,
                        batch,
                        num_shards=args.shards,
                        steps=args.steps,
                        unique=unique,
                        store=store,
                    )
                    r["prefill_s"] = fill
                    results.append(r)
            store.close()
            del store
    header = f"{'distinct':>10} {'dim':>4} {'batch':>6} {'ids':>6} {'train lookup/s':>15} {'eval lookup/s':>14} {'adagrad upd/s':>14} {'B/entry':>8} {'ratio':>6}"
    print(header)
    for r in results:
        print(
            f"{r['n_distinct']:>10} {r['dim']:>4} {r['batch']:>6} {'unique' if r['unique_ids_per_batch'] else 'zipf':>6} {r['train_lookup_ids_per_s'] / 1e6:>13.1f}M "
            f"{r['eval_lookup_ids_per_s'] / 1e6:>12.1f}M {r['update_ids_per_s'] / 1e6:>12.1f}M "
            f"{r['bytes_per_entry']:>8.1f} {r['bytes_per_entry_ratio']:>6.3f}"
        )
    print(
        f"numba first call: cold cache {compile_info['cold']['first_calls_s']:.2f}s, warm cache {compile_info['warm']['first_calls_s']:.2f}s"
    )
    doc = {"results": results, "first_call": compile_info}
    print(json.dumps(doc, indent=1))
    if args.json:
        args.json.write_text(json.dumps(doc, indent=1))
    head = next(
        (
            r
            for r in results
            if (r["n_distinct"], r["dim"], r["batch"], r["unique_ids_per_batch"])
            == (10_000_000, 16, 65536, False)
        ),
        results[0],
    )
    print(
        f"RESULT engine_lookup_ids_per_s={head['train_lookup_ids_per_s']:.0f} "
        f"engine_adagrad_update_ids_per_s={head['update_ids_per_s']:.0f} bytes_per_entry_ratio={head['bytes_per_entry_ratio']:.3f}"
    )


if __name__ == "__main__":
    main()
