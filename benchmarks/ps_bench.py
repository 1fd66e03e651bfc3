"""Embedding PS benchmark: the storage engine in-process and the PS service over loopback HTTP.

Workload: ids drawn Zipf(1.1) over ``n`` distinct ids (1M and 10M), dims 16 and 64, batches
of 4,096 and 65,536 ids, against a store pre-filled with all ``n`` entries, Adagrad.

* engine: ``run_engine_bench`` of ``ps_bench_engine.py`` (train lookup, eval lookup, Adagrad
  update), repeated; each pre-filled store serves both batch sizes. One thread, one internal
  shard, unless ``--threads 1,2`` names thread counts: then one store per count, each of
  ``max(threads)`` shards, measured in turn in every round, and a table of each count's rates
  against the first's.
* http: one PS replica as a real subprocess (real redis registry); the client sends msgpack
  ``/lookup`` (train) and ``/update`` through ``HttpClient`` with ``--inflight`` requests in
  flight, as an embedding worker does. The service store is cleared and re-filled once per
  (n, dim) and serves both batch sizes. Phases of one request are timed separately (client
  encode, server engine time from ``/metrics``, client decode; the rest is HTTP + framing).

Prints a table, writes JSON into ``bench_results/`` and ends with exactly one line::

    RESULT engine_lookup_ids_per_s=... engine_adagrad_update_ids_per_s=... \
http_lookup_ids_per_s=... bytes_per_entry_ratio=...

for dim 16, batch 65,536, 10M entries (or the largest configuration run). Rates are the
median over repeats; the JSON has min/median/max.

    python benchmarks/ps_bench.py [--quick] [--sizes 1000000,10000000] [--threads 1,2] [--profile]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from _common import fmt_rate, print_table, write_json
from plots import bar_chart_from_rows, saved
from ps_bench_engine import engine_grid, print_threads
from ps_bench_http import http_grid

HEAD = (10_000_000, 16, 65536)


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


# ------------------------------------------------------------------------------- main
def parse_args() -> tuple[argparse.Namespace, list[int], list[int], list[int]]:
    """The command line, with ``--steps``/``--repeats`` defaulted for ``--quick`` or not, and
    the grid's sizes, dims and batch sizes (the flags' or the defaults)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument(
        "--sizes", type=_ints, help="distinct ids, comma separated (default 1M,10M)"
    )
    parser.add_argument("--dims", type=_ints, help="default 16,64")
    parser.add_argument("--batches", type=_ints, help="default 4096,65536")
    parser.add_argument("--steps", type=int, help="batches per timed round")
    parser.add_argument("--repeats", type=int, help="timed rounds (median reported)")
    parser.add_argument("--inflight", type=int, default=4, help="concurrent HTTP requests")
    parser.add_argument(
        "--threads",
        type=_ints,
        default=[1],
        help="engine thread counts, "
        "e.g. 1,2: each measured in turn on stores of max(threads) shards",
    )
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument(
        "--profile", action="store_true", help="run the PS under cProfile (main thread)"
    )
    parser.add_argument("--json", type=Path, help="write the JSON here instead of bench_results/")
    args = parser.parse_args()
    if args.quick:
        sizes, dims, batches = [100_000], [16], [4096]
        args.steps, args.repeats = args.steps or 4, args.repeats or 1
    else:
        sizes, dims, batches = [1_000_000, 10_000_000], [16, 64], [4096, 65536]
        args.steps, args.repeats = args.steps or 12, args.repeats or 3
    return args, args.sizes or sizes, args.dims or dims, args.batches or batches


def print_grid(
    eng_by: dict[tuple, dict],
    http_by: dict[tuple, dict],
    http: list[dict[str, Any]],
    profile: str | None,
) -> None:
    """The engine and HTTP table per (n, dim, batch), each HTTP row's phase split, the profile."""
    table = []
    for key in sorted(set(eng_by) | set(http_by)):
        e, h = eng_by.get(key, {}), http_by.get(key, {})
        table.append(
            {
                "n": key[0],
                "dim": key[1],
                "batch": key[2],
                "eng_lookup": fmt_rate(e.get("train_lookup_ids_per_s")),
                "eng_eval": fmt_rate(e.get("eval_lookup_ids_per_s")),
                "eng_adagrad": fmt_rate(e.get("update_ids_per_s")),
                "http_lookup": fmt_rate(h.get("lookup_ids_per_s")),
                "http_update": fmt_rate(h.get("update_ids_per_s")),
                "srv_cpu": f"{h['server_cpu_share']:.2f}" if h else "-",
                "B/entry": f"{e['bytes_per_entry']:.1f}" if e else "-",
                "ratio": f"{(e or h)['bytes_per_entry_ratio']:.3f}",
            }
        )
    print_table(table, [(k, k) for k in table[0]] if table else [])
    for r in http:
        p = r["phases"]
        print(
            f"  phases n={r['n']} dim={r['dim']} batch={r['batch']} (1 request in flight): wall {p['wall_ms']:.1f} ms = "
            f"encode {p['client_encode_ms']:.1f} + engine {p['server_engine_ms']:.1f} + decode {p['client_decode_ms']:.1f} "
            f"+ http/server codec {p['http_and_server_codec_ms']:.1f}"
        )
    if profile:
        print(profile)


def save_chart(path: Path, eng_by: dict[tuple, dict], http_by: dict[tuple, dict]) -> None:
    """The PNG beside the JSON: ids/s of the engine and HTTP sides per (n, dim, batch)."""
    chart = [
        {
            "config": f"n={k[0]:,} d={k[1]} b={k[2]}",
            "engine lookup": eng_by.get(k, {}).get("train_lookup_ids_per_s"),
            "engine Adagrad": eng_by.get(k, {}).get("update_ids_per_s"),
            "HTTP lookup": http_by.get(k, {}).get("lookup_ids_per_s"),
            "HTTP update": http_by.get(k, {}).get("update_ids_per_s"),
        }
        for k in sorted(set(eng_by) | set(http_by))
    ]
    saved(
        bar_chart_from_rows(
            path,
            chart,
            "config",
            ["engine lookup", "engine Adagrad", "HTTP lookup", "HTTP update"],
            title="Embedding PS: ids/s (n ids, dim, batch)",
            ylabel="ids/s",
            logy=True,
        )
    )


def head_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The RESULT line's row: the ``HEAD`` configuration, else the largest dim-16 one."""
    if not rows:
        return {}
    exact = [r for r in rows if (r["n"], r["dim"], r["batch"]) == HEAD]
    return exact[0] if exact else max(rows, key=lambda r: (r["dim"] == 16, r["n"], r["batch"]))


def main() -> None:
    args, sizes, dims, batches = parse_args()
    t0 = time.perf_counter()
    threads = tuple(args.threads)
    print(f"engine (in-process, {', '.join(map(str, threads))} thread(s)):", flush=True)
    engine = (
        []
        if args.skip_engine
        else engine_grid(sizes, dims, batches, args.steps, args.repeats, threads)
    )
    print("service (loopback HTTP, msgpack):", flush=True)
    http, profile = ([], None) if args.skip_http else http_grid(args, sizes, dims, batches)

    print_threads(engine, threads)
    engine_first = [r for r in engine if r["threads"] == threads[0]]  # the table's and RESULT's
    eng_by = {(r["n"], r["dim"], r["batch"]): r for r in engine_first}
    http_by = {(r["n"], r["dim"], r["batch"]): r for r in http}
    print_grid(eng_by, http_by, http, profile)
    path = write_json(
        "ps_bench",
        {
            "args": {k: v for k, v in vars(args).items() if k != "json"},
            "engine": engine,
            "http": http,
            "profile": profile,
            "wall_s": time.perf_counter() - t0,
        },
        args.json,
    )
    print(f"JSON: {path}  ({time.perf_counter() - t0:.0f} s)")
    save_chart(path, eng_by, http_by)
    e, h = head_row(engine_first), head_row(http)
    print(
        f"RESULT engine_lookup_ids_per_s={e.get('train_lookup_ids_per_s', float('nan')):.0f} "
        f"engine_adagrad_update_ids_per_s={e.get('update_ids_per_s', float('nan')):.0f} "
        f"http_lookup_ids_per_s={h.get('lookup_ids_per_s', float('nan')):.0f} "
        f"bytes_per_entry_ratio={(e or h).get('bytes_per_entry_ratio', float('nan')):.3f}"
    )


if __name__ == "__main__":
    main()
