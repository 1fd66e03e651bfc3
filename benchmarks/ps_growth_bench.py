"""How long a PS shard takes to grow its arrays while new ids keep arriving, in place or copied.

A PS that trains on a set with many distinct ids grows during the epoch (the Criteo-shaped
end-to-end set: 1.7M entries in one internal shard, ~8,000 new ids a batch). Each growth
runs ``pyrsia.services.embedding_ps.shard._grow``: in place (``ndarray.resize``, glibc's ``realloc``
moving the pages of a large block with ``mremap``), or, when something else still refers to
the array, a new array and a copy. This benchmark inserts ``--entries`` new ids through the real
store (``EmbeddingStore.lookup(train=True)``: growth, hash insert, row initialization) in
batches, once as the store runs (in place) and once with a reference held to each array
before every batch (which makes ``_grow`` take its copy path: what the store did for
every growth until the fifth stop of issue 10). Each run is a fresh process (the allocator's
state matters), the two alternate, and the medians are compared::

    python benchmarks/ps_growth_bench.py [--entries 1700000] [--batch 8000] [--dim 16]
                                         [--repeats 3] [--quick] [--json F]

Ends with ``RESULT in_place_s=... copy_s=... ratio=...`` (copy time over in-place time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, print_table, write_json
from plots import save_bar_chart, saved

CHILD = """
import json, resource, sys, time
import numpy as np
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.embedding_spec import AdagradSpec

entries, batch, dim, copy = (int(a) for a in sys.argv[1:5])
store = EmbeddingStore(2 * entries, num_shards=1, optimizer=AdagradSpec())
ids = np.arange(1, entries + 1, dtype=np.uint64) * np.uint64(2654435761)
store.lookup(ids[:1], dim, train=True)  # kernels loaded before the clock starts
held = []  # with copy=1: a reference to each array, so that every growth copies
faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
started = time.perf_counter()
for start in range(1, entries, batch):
    if copy:
        held[:] = [a for s in store._shards for a in (s.ent, *(x.data for x in s.arenas if x))]
    store.lookup(ids[start:start + batch], dim, train=True)
print(json.dumps({"seconds": time.perf_counter() - started,
                  "page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0,
                  "entries": store.stats()["entries"]}))
"""


def run_child(entries: int, batch: int, dim: int, copy: bool) -> dict:
    """One growth from empty to ``entries`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(entries), str(batch), str(dim), str(int(copy))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"growth run failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked; ``--quick``: 200,000 entries, one repeat."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_700_000, help="entries to grow to")
    parser.add_argument("--batch", type=int, default=8_000, help="new entries per batch")
    parser.add_argument(
        "--dim", type=int, default=16, help="embedding dim (Adagrad: 2 x dim floats a row)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each, alternating")
    parser.add_argument("--quick", action="store_true", help="200,000 entries, 1 repeat")
    parser.add_argument("--json", type=Path, default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.entries, args.repeats = 200_000, 1
    if min(args.entries, args.batch, args.dim, args.repeats) < 1:
        parser.error("--entries, --batch, --dim, --repeats: expected positive integers")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs: dict[str, list[dict]] = {"in place": [], "copy": []}
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        for side in runs:
            runs[side].append(run_child(args.entries, args.batch, args.dim, side == "copy"))
    median = {side: statistics.median(r["seconds"] for r in rs) for side, rs in runs.items()}
    rows = [
        {
            "side": side,
            "median_s": f"{median[side]:.3f}",
            "runs_s": " / ".join(f"{r['seconds']:.3f}" for r in rs),
            "page_faults": f"{statistics.median(r['page_faults'] for r in rs):.0f}",
        }
        for side, rs in runs.items()
    ]
    print(
        f"PS store (one internal shard) from empty to {args.entries:,} entries of dim {args.dim} "
        f"(Adagrad), {args.batch:,} new ids a batch ({time.perf_counter() - t0:.1f}s)"
    )
    print_table(
        rows,
        [
            ("side", "growth"),
            ("median_s", "insert s"),
            ("runs_s", "runs s"),
            ("page_faults", "page faults"),
        ],
    )
    ratio = median["copy"] / median["in place"]
    path = write_json(
        "ps_growth_bench",
        {"args": vars(args) | {"json": None}, "runs": runs, "median_s": median, "ratio": ratio},
        args.json,
    )
    print(f"\nJSON: {path}")
    saved(
        save_bar_chart(
            path,
            list(median),
            list(median.values()),
            title=f"PS store growth to {args.entries:,} entries (copy / in place {ratio:.2f})",
            ylabel="insert seconds (median)",
        )
    )
    print(
        f"RESULT in_place_s={median['in place']:.4f} copy_s={median['copy']:.4f} ratio={ratio:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
