"""The HTTP half of the PS benchmark (``ps_bench.py``): one PS replica started as a process
and driven over HTTP the way an embedding worker drives it (``PSDriver``: lookups and
updates of Zipf-distributed ids with ``--inflight`` requests in flight), for every size,
dim and batch of the grid; latency from the PS's own ``/metrics``, CPU from ``/proc``.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import Cluster, cpu_seconds, fmt_rate
from ps_bench_engine import rank_to_id, zipf_batches

from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import ROLE_EMBEDDING_PS
from pyrsia.shared.embedding_spec import EmbeddingHyperparams
from pyrsia.shared.http_client import HttpClient

PREFILL_CHUNK = 1 << 18
"""Ids per /lookup while the PS is filled before a measurement."""


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
                    print(
                        f"  http n={n} dim={dim} batch={batch}: lookup {fmt_rate(row['lookup_ids_per_s'])}/s "
                        f"update {fmt_rate(row['update_ids_per_s'])}/s (cpu: server {row['server_cpu_share']:.2f}, client {row['client_cpu_share']:.2f})",
                        flush=True,
                    )
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
