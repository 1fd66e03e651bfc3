"""Checkpoint dump and load of one large PS table with 1 thread and with N threads, same run.

``common_config.checkpointing_config.num_workers`` is the number of threads a PS dumps and
loads its checkpoint with (pyrsia/services/embedding_ps/checkpoint_files.py). One store is filled with
``--entries`` ids of ``--dim`` floats trained with Adagrad (rows of 2 x dim floats: embedding and
accumulator), then dumped and loaded ``--repeats`` times with 1 and with ``--workers`` threads,
interleaved so both see the same machine load. The ratio is the one-thread median over the
N-thread median. Each dump's files are checked byte-identical to the first one-thread dump.

    python benchmarks/ps_checkpoint_bench.py [--entries 2000000] [--dim 32] [--workers 4] [--quick]
"""

from __future__ import annotations

import argparse
import filecmp
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import print_table, write_json  # noqa: E402
from plots import bar_chart_from_rows, saved  # noqa: E402

from pyrsia.services.embedding_ps.engine import EmbeddingStore  # noqa: E402
from pyrsia.shared.embedding_spec import AdagradSpec  # noqa: E402


def _filled_store(entries: int, dim: int, shards: int) -> EmbeddingStore:
    store = EmbeddingStore(capacity=entries, num_shards=shards)
    store.register_optimizer(AdagradSpec())
    ids = np.random.default_rng(0).choice(np.uint64(1) << np.uint64(62), entries, replace=False)
    for start in range(0, entries, 1 << 18):
        store.lookup(ids[start : start + (1 << 18)].astype(np.uint64), dim, train=True)
    return store


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".npy")


def _same_bytes(a: Path, b: Path) -> bool:
    fa, fb = _data_files(a), _data_files(b)
    return len(fa) == len(fb) and all(
        filecmp.cmp(x, y, shallow=False) for x, y in zip(fa, fb, strict=True)
    )


def parse_args() -> argparse.Namespace:
    """The command line; ``--quick`` makes the table small and runs once."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=8, help="num_hashmap_internal_shards")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a small table, one repeat")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.entries, args.repeats = 100_000, 1
    return args


def time_dumps_and_loads(
    store: EmbeddingStore, args: argparse.Namespace
) -> tuple[dict[str, dict[int, list[float]]], bool]:
    """Seconds of each dump and load with 1 and with ``--workers`` threads, ``--repeats``
    times interleaved; and whether every dump's files are byte-identical to a 1-thread one."""
    times: dict[str, dict[int, list[float]]] = {"dump": {}, "load": {}}
    identical = True
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        first = Path(root) / "reference"
        store.dump(first, 0, 1, workers=1)
        for r in range(args.repeats):
            for workers in (1, args.workers):
                target = Path(root) / f"w{workers}-{r}"
                started = time.perf_counter()
                store.dump(target, 0, 1, workers=workers)
                times["dump"].setdefault(workers, []).append(time.perf_counter() - started)
                identical &= _same_bytes(first, target)
                fresh = EmbeddingStore(capacity=args.entries, num_shards=args.shards)
                started = time.perf_counter()
                loaded = fresh.load(target, 0, 1, workers=workers)
                times["load"].setdefault(workers, []).append(time.perf_counter() - started)
                assert loaded == len(store), (loaded, len(store))
                del fresh
    return times, identical


def result_rows(
    times: dict[str, dict[int, list[float]]], args: argparse.Namespace, table_mb: float
) -> list[dict]:
    """One row per operation: median seconds at 1 and ``--workers`` threads, MB/s, speedup."""
    rows = []
    for op, by_workers in times.items():
        one, many = statistics.median(by_workers[1]), statistics.median(by_workers[args.workers])
        rows.append(
            {
                "op": op,
                "entries": args.entries,
                "table_mb": round(table_mb),
                "t_1_thread_s": round(one, 3),
                f"t_{args.workers}_threads_s": round(many, 3),
                "speedup": round(one / many, 2),
                "mb_per_s_1": round(table_mb / one),
                f"mb_per_s_{args.workers}": round(table_mb / many),
            }
        )
    return rows


def main() -> int:
    args = parse_args()
    store = _filled_store(args.entries, args.dim, args.shards)
    table_mb = args.entries * (2 * args.dim * 4 + 8) / 1e6
    times, identical = time_dumps_and_loads(store, args)
    rows = result_rows(times, args, table_mb)
    print(
        f"PS checkpoint, {args.entries} entries x dim {args.dim} (Adagrad), {args.shards} shards, "
        f"median of {args.repeats}, interleaved; files byte-identical: {identical}"
    )
    n = args.workers
    print_table(
        rows,
        [
            ("op", "op"),
            ("table_mb", "MB"),
            ("t_1_thread_s", "1 thread s"),
            (f"t_{n}_threads_s", f"{n} threads s"),
            ("speedup", "ratio"),
            ("mb_per_s_1", "MB/s 1"),
            (f"mb_per_s_{n}", f"MB/s {n}"),
        ],
    )
    doc = {
        "benchmark": "ps_checkpoint",
        "args": vars(args) | {"json": None},
        "results": rows,
        "raw_seconds": {op: {str(k): v for k, v in d.items()} for op, d in times.items()},
        "files_identical": identical,
    }
    path = write_json("ps_checkpoint", doc, args.json)
    print(f"JSON: {path}")
    saved(
        bar_chart_from_rows(
            path,
            rows,
            "op",
            {"mb_per_s_1": "1 thread", f"mb_per_s_{n}": f"{n} threads"},
            title=f"PS checkpoint, {rows[0]['table_mb']} MB table",
            ylabel="MB/s",
        )
    )
    return 0 if identical else 1


if __name__ == "__main__":
    raise SystemExit(main())
