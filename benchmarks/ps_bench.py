"""Embedding PS benchmark: the storage engine in-process and the PS service over loopback HTTP.

Workload: ids drawn Zipf(1.1) over ``n`` distinct ids (1M and 10M), dims 16 and 64, batches
of 4,096 and 65,536 ids, against a store pre-filled with all ``n`` entries, Adagrad.

* engine: ``run_engine_bench`` of ``ps_bench_engine.py`` (train lookup, eval lookup, Adagrad
  update, one thread), repeated; each pre-filled store serves both batch sizes.
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

    python benchmarks/ps_bench.py [--quick] [--sizes 1000000,10000000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import Cluster, cpu_seconds, fmt_rate, print_table, write_json
from plots import bar_chart_from_rows, saved
from ps_bench_engine import OPTIMIZERS, rank_to_id, run_engine_bench, zipf_batches

from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import EmbeddingHyperparams
from pyrsia.shared.http_client import HttpClient

HEAD = (10_000_000, 16, 65536)
PREFILL_CHUNK = 1 << 18


def _ints(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


# ------------------------------------------------------------------------------- engine
def prefill_store(n: int, dim: int) -> tuple[EmbeddingStore, float]:
    """A one-shard Adagrad store holding exactly the ``n`` ids the Zipf ranks map to."""
    store = EmbeddingStore(
        n, num_shards=1, hyperparams=EmbeddingHyperparams(), optimizer=OPTIMIZERS["adagrad"]
    )
    t0 = time.perf_counter()
    for start in range(0, n, 1 << 20):
        store.lookup(rank_to_id(np.arange(start, min(n, start + (1 << 20)))), dim, train=True)
    return store, time.perf_counter() - t0


def engine_grid(sizes, dims, batches, steps: int, repeats: int) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        for dim in dims:
            store, fill_s = prefill_store(n, dim)
            for batch in batches:
                runs = [
                    run_engine_bench(n, dim, batch, steps=steps, seed=r, store=store)
                    for r in range(repeats)
                ]
                row = {"part": "engine", "n": n, "dim": dim, "batch": batch, "prefill_s": fill_s}
                for key in ("train_lookup_ids_per_s", "eval_lookup_ids_per_s", "update_ids_per_s"):
                    vals = [r[key] for r in runs]
                    row[key] = statistics.median(vals)
                    row[key + "_minmax"] = (min(vals), max(vals))
                for key in ("bytes_per_entry", "raw_bytes_per_entry", "bytes_per_entry_ratio"):
                    row[key] = runs[-1][key]
                rows.append(row)
                print(f"  engine n={n} dim={dim} batch={batch}: lookup {fmt_rate(row['train_lookup_ids_per_s'])}/s "
                      f"update {fmt_rate(row['update_ids_per_s'])}/s ratio {row['bytes_per_entry_ratio']:.3f}", flush=True)  # fmt: skip
            store.close()
            del store
            gc.collect()
    return rows


# ------------------------------------------------------------------------------- http
def _metric_sum(text: str, op: str) -> tuple[float, float]:
    """(sum, count) of pyrsia_ps_request_seconds for ``op`` in Prometheus text."""
    out = []
    for suffix in ("sum", "count"):
        m = re.search(rf'pyrsia_ps_request_seconds_{suffix}{{op="{op}"}} ([0-9.e+-]+)', text)
        out.append(float(m.group(1)) if m else 0.0)
    return out[0], out[1]


class PSDriver:
    """Drives one PS replica over HTTP the way an embedding worker does."""

    def __init__(self, url: str, inflight: int) -> None:
        self.url = url
        self.inflight = inflight
        self.http = HttpClient(timeout_s=600.0)

    async def call(self, path: str, body: Any) -> Any:
        return await self.http.call(f"{self.url}{path}", body, idempotent=True)

    async def metrics(self) -> str:
        session = self.http._get_session()
        async with session.get(f"{self.url}/metrics") as resp:
            return await resp.text()

    async def prefill(self, n: int, dim: int) -> float:
        await self.call("/clear", {})
        t0 = time.perf_counter()
        for start in range(0, n, PREFILL_CHUNK):
            ids = rank_to_id(np.arange(start, min(n, start + PREFILL_CHUNK)))
            await self.call("/lookup", {"train": True, "groups": [{"dim": dim, "ids": ids}]})
        return time.perf_counter() - t0

    async def pump(self, bodies: list[dict[str, Any]], path: str) -> float:
        """Send every body with ``inflight`` concurrent requests; the wall seconds."""
        it = iter(bodies)

        async def lane() -> None:
            for body in it:
                await self.call(path, body)

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(self.inflight)))
        return time.perf_counter() - t0

    async def phases(self, ids: np.ndarray, dim: int, repeats: int) -> dict[str, float]:
        """One request at a time: client encode, server engine, client decode, the rest."""
        body = {"train": True, "groups": [{"dim": dim, "ids": ids}]}
        before = _metric_sum(await self.metrics(), "lookup_train")
        walls, enc, dec = [], [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await self.call("/lookup", body)
            walls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for _ in range(repeats):
            raw = packb(body)
        enc = (time.perf_counter() - t0) / repeats
        answer = packb({"groups": [np.zeros((len(ids), dim), np.float32)]})
        t0 = time.perf_counter()
        for _ in range(repeats):
            unpackb(answer)
        dec = (time.perf_counter() - t0) / repeats
        after = _metric_sum(await self.metrics(), "lookup_train")
        engine = (after[0] - before[0]) / max(after[1] - before[1], 1)
        wall = statistics.median(walls)
        return {
            "wall_ms": wall * 1e3,
            "client_encode_ms": enc * 1e3,
            "server_engine_ms": engine * 1e3,
            "client_decode_ms": dec * 1e3,
            "http_and_server_codec_ms": (wall - enc - dec - engine) * 1e3,
            "request_bytes": len(raw),
            "response_bytes": len(answer),
        }

    async def grid(
        self, pid: int, sizes, dims, batches, steps: int, repeats: int
    ) -> list[dict[str, Any]]:
        await self.call("/configure", {"hyperparams": EmbeddingHyperparams().to_dict()})
        await self.call("/register_optimizer", {"optimizer": {"type": "adagrad"}})
        rows = []
        for n in sizes:
            for dim in dims:
                fill_s = await self.prefill(n, dim)
                stats = await self.call("/stats", {})
                for batch in batches:
                    row = await self._one(pid, n, dim, batch, steps, repeats)
                    row.update(
                        prefill_s=fill_s,
                        bytes_per_entry_ratio=stats["bytes_per_entry"]
                        / stats["raw_bytes_per_entry"],
                    )
                    rows.append(row)
                    print(f"  http n={n} dim={dim} batch={batch}: lookup {fmt_rate(row['lookup_ids_per_s'])}/s "
                          f"update {fmt_rate(row['update_ids_per_s'])}/s (cpu: server {row['server_cpu_share']:.2f}, client {row['client_cpu_share']:.2f})", flush=True)  # fmt: skip
        await self.http.close()
        return rows

    async def _one(
        self, pid: int, n: int, dim: int, batch: int, steps: int, repeats: int
    ) -> dict[str, Any]:
        rates: dict[str, list[float]] = {"lookup": [], "update": []}
        grads = np.random.default_rng(0).normal(scale=1e-3, size=(batch, dim)).astype(np.float32)
        cpu_share, client_share = [], []
        for r in range(repeats + 1):  # the first round warms connections and caches
            id_batches = zipf_batches(n, batch, steps, seed=100 + r)
            lookups = [{"train": True, "groups": [{"dim": dim, "ids": ids}]} for ids in id_batches]
            updates = [{"groups": [{"dim": dim, "ids": ids, "grads": grads}]} for ids in id_batches]
            cpu0, me0 = cpu_seconds(pid), cpu_seconds(os.getpid())
            wall = await self.pump(lookups, "/lookup")
            if r:
                cpu_share.append((cpu_seconds(pid) - cpu0) / wall)
                client_share.append((cpu_seconds(os.getpid()) - me0) / wall)
                rates["lookup"].append(batch * steps / wall)
            wall = await self.pump(updates, "/update")
            if r:
                rates["update"].append(batch * steps / wall)
        row: dict[str, Any] = {
            "part": "http",
            "n": n,
            "dim": dim,
            "batch": batch,
            "inflight": self.inflight,
        }
        for op, vals in rates.items():
            row[f"{op}_ids_per_s"] = statistics.median(vals)
            row[f"{op}_ids_per_s_minmax"] = (min(vals), max(vals))
        row["server_cpu_share"] = statistics.median(cpu_share)
        row["client_cpu_share"] = statistics.median(client_share)
        row["phases"] = await self.phases(
            zipf_batches(n, batch, 1, seed=7)[0], dim, max(3, steps // 2)
        )
        return row


def http_grid(args, sizes, dims, batches) -> tuple[list[dict[str, Any]], str | None]:
    n_max = max(sizes)
    with tempfile.TemporaryDirectory(prefix="ps-bench-") as tmp:
        glob = Path(tmp) / "global.yml"
        glob.write_text(
            f"embedding_parameter_server_config: {{capacity: {n_max}, num_hashmap_internal_shards: 1}}\n"
        )
        prof = Path(tmp) / "ps.prof"
        with Cluster() as cluster:
            ps = cluster.start(
                "pyrsia.services.embedding_ps",
                [
                    "--global-config",
                    str(glob),
                    "--port",
                    "0",
                    "--replica-index",
                    "0",
                    "--replica-size",
                    "1",
                ],
                role=ROLE_EMBEDDING_PS,
                wait_ready=False,
                python_args=["cProfile", "-o", str(prof)] if args.profile else None,
            )
            driver = PSDriver(ps.url, args.inflight)
            rows = asyncio.run(
                driver.grid(ps.proc.pid, sizes, dims, batches, args.steps, args.repeats)
            )
        profile = None
        if args.profile and prof.exists():
            import io
            import pstats

            buf = io.StringIO()
            pstats.Stats(str(prof), stream=buf).sort_stats("tottime").print_stats(25)
            profile = buf.getvalue()
    return rows, profile


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


def print_grid(eng_by: dict[tuple, dict], http_by: dict[tuple, dict], http: list[dict[str, Any]],
               profile: str | None) -> None:  # fmt: skip
    """The engine and HTTP table per (n, dim, batch), each HTTP row's phase split, the profile."""
    table = []
    for key in sorted(set(eng_by) | set(http_by)):
        e, h = eng_by.get(key, {}), http_by.get(key, {})
        table.append({
            "n": key[0], "dim": key[1], "batch": key[2],
            "eng_lookup": fmt_rate(e.get("train_lookup_ids_per_s")),
            "eng_eval": fmt_rate(e.get("eval_lookup_ids_per_s")),
            "eng_adagrad": fmt_rate(e.get("update_ids_per_s")),
            "http_lookup": fmt_rate(h.get("lookup_ids_per_s")),
            "http_update": fmt_rate(h.get("update_ids_per_s")),
            "srv_cpu": f"{h['server_cpu_share']:.2f}" if h else "-",
            "B/entry": f"{e['bytes_per_entry']:.1f}" if e else "-",
            "ratio": f"{(e or h)['bytes_per_entry_ratio']:.3f}",
        })  # fmt: skip
    print_table(table, [(k, k) for k in table[0]] if table else [])
    for r in http:
        p = r["phases"]
        print(f"  phases n={r['n']} dim={r['dim']} batch={r['batch']} (1 request in flight): wall {p['wall_ms']:.1f} ms = "
              f"encode {p['client_encode_ms']:.1f} + engine {p['server_engine_ms']:.1f} + decode {p['client_decode_ms']:.1f} "
              f"+ http/server codec {p['http_and_server_codec_ms']:.1f}")  # fmt: skip
    if profile:
        print(profile)


def save_chart(path: Path, eng_by: dict[tuple, dict], http_by: dict[tuple, dict]) -> None:
    """The PNG beside the JSON: ids/s of the engine and HTTP sides per (n, dim, batch)."""
    chart = [{"config": f"n={k[0]:,} d={k[1]} b={k[2]}",
              "engine lookup": eng_by.get(k, {}).get("train_lookup_ids_per_s"),
              "engine Adagrad": eng_by.get(k, {}).get("update_ids_per_s"),
              "HTTP lookup": http_by.get(k, {}).get("lookup_ids_per_s"),
              "HTTP update": http_by.get(k, {}).get("update_ids_per_s")}
             for k in sorted(set(eng_by) | set(http_by))]  # fmt: skip
    saved(bar_chart_from_rows(path, chart, "config", ["engine lookup", "engine Adagrad", "HTTP lookup", "HTTP update"],
                              title="Embedding PS: ids/s (n ids, dim, batch)", ylabel="ids/s", logy=True))  # fmt: skip


def head_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The RESULT line's row: the ``HEAD`` configuration, else the largest dim-16 one."""
    if not rows:
        return {}
    exact = [r for r in rows if (r["n"], r["dim"], r["batch"]) == HEAD]
    return exact[0] if exact else max(rows, key=lambda r: (r["dim"] == 16, r["n"], r["batch"]))


def main() -> None:
    args, sizes, dims, batches = parse_args()
    t0 = time.perf_counter()
    print("engine (in-process, one thread):", flush=True)
    engine = [] if args.skip_engine else engine_grid(sizes, dims, batches, args.steps, args.repeats)
    print("service (loopback HTTP, msgpack):", flush=True)
    http, profile = ([], None) if args.skip_http else http_grid(args, sizes, dims, batches)

    eng_by = {(r["n"], r["dim"], r["batch"]): r for r in engine}
    http_by = {(r["n"], r["dim"], r["batch"]): r for r in http}
    print_grid(eng_by, http_by, http, profile)
    path = write_json("ps_bench", {"args": {k: v for k, v in vars(args).items() if k != "json"}, "engine": engine, "http": http,
                                   "profile": profile, "wall_s": time.perf_counter() - t0}, args.json)  # fmt: skip
    print(f"JSON: {path}  ({time.perf_counter() - t0:.0f} s)")
    save_chart(path, eng_by, http_by)
    e, h = head_row(engine), head_row(http)
    print(
        f"RESULT engine_lookup_ids_per_s={e.get('train_lookup_ids_per_s', float('nan')):.0f} "
        f"engine_adagrad_update_ids_per_s={e.get('update_ids_per_s', float('nan')):.0f} "
        f"http_lookup_ids_per_s={h.get('lookup_ids_per_s', float('nan')):.0f} "
        f"bytes_per_entry_ratio={(e or h).get('bytes_per_entry_ratio', float('nan')):.3f}"
    )


if __name__ == "__main__":
    main()
