"""Embedding worker benchmark: Criteo-shaped batches through one worker and two PS replicas.

Each batch is 4,096 samples x 26 single-id slots (dim 16, Zipf(1.1) ids over 10M per slot).
A real redis-server, two PS replicas and one embedding worker run as subprocesses on
loopback. ``--inflight`` lanes each do, per batch, what a data loader and an NN worker do:
``POST /batch`` (id part), ``/lookup`` (train) and ``/gradients`` (one float32 gradient per
slot), so several batches are in flight at once. A warm-up pass inserts the ids first.

In the same run, the yardstick: a single-process PyTorch training step on the same batch
(one ``nn.EmbeddingBag(mode="sum", sparse=True)`` table with offsets for the 26 slots, an
MLP 512-256-1 over 13 dense features + the pooled embeddings, sparse ``Adagrad`` for the
embeddings and ``Adam`` for the MLP), timed per batch.

Reports per-route client latencies, the worker's own lookup/update latencies from
``/metrics``, and each process's CPU share (``/proc/<pid>/stat``) during the timed rounds.
Ends with::

    baseline_samples_per_s=... ratio=...
    RESULT ew_samples_per_s=... ew_ids_per_s=...

    python benchmarks/ew_bench.py [--quick] [--batches 40] [--inflight 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from _common import Cluster, cpu_seconds, fmt_rate, print_table, summarize, write_json
from ew_bench_baseline import best_baseline
from ew_workload import DIM, SLOTS, make_ids
from plots import save_bar_chart, saved

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from pyrsia.shared.embedding_spec import EmbeddingHyperparams
from pyrsia.shared.http_client import HttpClient


# ------------------------------------------------------------------------------- pipeline
def id_part(ids: np.ndarray) -> dict[str, Any]:
    """The PersiaBatch id part (protocol.md) of a (batch, SLOTS) id matrix."""
    batch = ids.shape[0]
    offsets = np.arange(batch + 1, dtype=np.int64)
    cols = np.ascontiguousarray(ids.T)
    return {
        "batch_size": batch,
        "requires_grad": True,
        "id_type_features": [
            {"name": f"slot_{s}", "ids": cols[s], "offsets": offsets} for s in range(SLOTS)
        ],
    }


class Pipeline:
    """Lanes that push batches through /batch, /lookup and /gradients of one worker."""

    def __init__(self, url: str, inflight: int, batch: int) -> None:
        self.url = url
        self.inflight = inflight
        self.http = HttpClient(timeout_s=600.0)
        grads = np.random.default_rng(1).normal(scale=1e-3, size=(batch, DIM)).astype(np.float32)
        self.gradients = [{"name": f"slot_{s}", "data": grads} for s in range(SLOTS)]
        self.next_id = 0
        self.latency: dict[str, list[float]] = {"batch": [], "lookup": [], "gradients": []}

    async def _timed(self, route: str, body: Any) -> Any:
        t0 = time.perf_counter()
        out = await self.http.call(f"{self.url}/{route}", body, until=time.monotonic() + 600)
        self.latency[route].append(time.perf_counter() - t0)
        return out

    async def one(self, part: dict[str, Any]) -> None:
        batch_id = self.next_id
        self.next_id += 1
        await self._timed("batch", {"loader": 0, "batch_id": batch_id, "batch": part})
        answer = await self._timed("lookup", {"batch_id": batch_id, "train": True})
        if len(answer["embeddings"]) != SLOTS:
            raise RuntimeError(f"expected {SLOTS} embeddings, got {len(answer['embeddings'])}")
        await self._timed(
            "gradients", {"batch_id": batch_id, "loss_scale": 1.0, "gradients": self.gradients}
        )

    async def run(self, parts: list[dict[str, Any]]) -> float:
        """Every part through the worker with ``inflight`` lanes; the wall seconds."""
        it = iter(parts)

        async def lane() -> None:
            for part in it:
                await self.one(part)

        t0 = time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(self.inflight)))
        return time.perf_counter() - t0

    async def metrics(self) -> dict[str, float]:
        session = self.http._get_session()
        async with session.get(f"{self.url}/metrics") as resp:
            text = await resp.text()
        out = {}
        for m in re.finditer(r"^(pyrsia_ew_\w+_seconds_(?:sum|count)) ([0-9.e+-]+)$", text, re.M):
            out[m.group(1)] = float(m.group(2))
        return out


async def run_pipeline(
    url: str, pids: dict[str, int], batch: int, n_batches: int, repeats: int, inflight: int
) -> dict[str, Any]:
    pipe = Pipeline(url, inflight, batch)
    await pipe.http.call(f"{url}/configure", {"hyperparams": EmbeddingHyperparams().to_dict()})
    await pipe.http.call(f"{url}/register_optimizer", {"optimizer": {"type": "adagrad"}})
    parts = [id_part(ids) for ids in make_ids(batch, n_batches, seed=0)]
    warm = await pipe.run(parts)  # inserts the ids, warms connections, loads kernels
    walls, cpu = [], {k: [] for k in [*pids, "bench"]}
    before = await pipe.metrics()
    for k in pipe.latency:
        pipe.latency[k].clear()
    for _ in range(repeats):
        c0 = {k: cpu_seconds(p) for k, p in pids.items()} | {"bench": cpu_seconds(os.getpid())}
        wall = await pipe.run(parts)
        walls.append(wall)
        for k, p in [*pids.items(), ("bench", os.getpid())]:
            cpu[k].append((cpu_seconds(p) - c0[k]) / wall)
    after = await pipe.metrics()
    await pipe.http.close()
    worker_ms = {}
    for name in ("lookup", "update"):
        s = f"pyrsia_ew_{name}_seconds_sum"
        c = f"pyrsia_ew_{name}_seconds_count"
        n = after.get(c, 0) - before.get(c, 0)
        worker_ms[name] = 1e3 * (after.get(s, 0) - before.get(s, 0)) / n if n else float("nan")
    rates = [batch * n_batches / w for w in walls]
    return {
        "warmup_s": warm,
        "wall": summarize(walls),
        "samples_per_s": statistics.median(rates),
        "samples_per_s_minmax": (min(rates), max(rates)),
        "route_latency_ms": {
            k: {"median": 1e3 * statistics.median(v), "min": 1e3 * min(v)}
            for k, v in pipe.latency.items()
            if v
        },
        "worker_internal_ms": worker_ms,
        "cpu_share": {k: statistics.median(v) for k, v in cpu.items()},
        # CPU milliseconds each process spent per batch: robust to other load on the machine
        "cpu_ms_per_batch": {
            k: 1e3 * statistics.median(v) * statistics.median(walls) / n_batches
            for k, v in cpu.items()
        },
    }


# ------------------------------------------------------------------------------- main
def start_cluster(cluster: Cluster, tmp: Path, capacity: int) -> tuple[str, dict[str, int]]:
    emb = tmp / "embedding_config.yml"
    emb.write_text(
        "slots_config:\n" + "".join(f"  slot_{s}: {{dim: {DIM}}}\n" for s in range(SLOTS))
    )
    glob = tmp / "global_config.yml"
    glob.write_text(
        f"embedding_parameter_server_config: {{capacity: {capacity}, num_hashmap_internal_shards: 1}}\n"
        "embedding_worker_config: {forward_buffer_size: 1000, buffered_data_expired_sec: 1000}\n"
    )
    flags = ["--embedding-config", str(emb), "--global-config", str(glob), "--port", "0"]
    pids = {}
    for i in range(2):
        ps = cluster.start(
            "pyrsia.services.embedding_ps",
            [*flags, "--replica-index", str(i), "--replica-size", "2"],
            role=ROLE_EMBEDDING_PS,
            replica_index=i,
            wait_ready=False,
        )
        pids[f"ps{i}"] = ps.proc.pid
    worker = cluster.start(
        "pyrsia.services.embedding_worker",
        [*flags, "--replica-index", "0", "--replica-size", "1"],
        role=ROLE_EMBEDDING_WORKER,
    )
    pids["worker"] = worker.proc.pid
    return worker.url, pids


def print_summary(ew: dict[str, Any], base: dict[str, Any]) -> None:
    """The two sides' table, then the worker's route latency, internal time, CPU and cores."""
    lo, hi = ew["samples_per_s_minmax"]
    print_table(
        [
            {
                "what": "embedding worker (1 EW + 2 PS, HTTP)",
                "samples/s median": fmt_rate(ew["samples_per_s"]),
                "min..max": f"{fmt_rate(lo)}..{fmt_rate(hi)}",
                "ids/s": fmt_rate(ew["samples_per_s"] * SLOTS),
            },
            {
                "what": f"pytorch step ({base['torch_threads']} threads)",
                "samples/s median": fmt_rate(base["samples_per_s"]),
                "min..max": f"best {fmt_rate(base['samples_per_s_best'])}",
                "ids/s": fmt_rate(base["samples_per_s"] * SLOTS),
            },
        ],
        [
            ("what", "what"),
            ("samples/s median", "samples/s (median)"),
            ("min..max", "range"),
            ("ids/s", "ids/s"),
        ],
    )
    lat = ew["route_latency_ms"]
    print(
        "route latency ms (median/min): "
        + ", ".join(f"{k} {v['median']:.1f}/{v['min']:.1f}" for k, v in lat.items())
    )
    print(
        "worker internal ms: "
        + ", ".join(f"{k} {v:.1f}" for k, v in ew["worker_internal_ms"].items())
    )
    print(
        "cpu ms per batch: "
        + ", ".join(f"{k} {v:.1f}" for k, v in ew["cpu_ms_per_batch"].items())
        + f"; pytorch step {1e3 * base['step_s']['median_s']:.1f} ms wall"
    )
    print(
        "cpu share (cores) during timed rounds: "
        + ", ".join(f"{k} {v:.2f}" for k, v in ew["cpu_share"].items())
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--batch", type=int, help="samples per batch (default 4096)")
    parser.add_argument("--batches", type=int, help="batches per timed round")
    parser.add_argument("--repeats", type=int, help="timed rounds (median reported)")
    parser.add_argument("--inflight", type=int, default=4, help="batches in flight")
    parser.add_argument("--baseline-rows", type=int, help="EmbeddingBag rows per slot (default 1M)")
    parser.add_argument("--json", type=Path, help="write the JSON here instead of bench_results/")
    args = parser.parse_args()
    batch = args.batch or (256 if args.quick else 4096)
    n_batches = args.batches or (4 if args.quick else 30)
    repeats = args.repeats or (1 if args.quick else 3)
    rows = args.baseline_rows or (10_000 if args.quick else 1_000_000)
    t0 = time.perf_counter()

    print(
        f"embedding worker: {n_batches} batches x {batch} samples x {SLOTS} slots, {args.inflight} in flight",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ew-bench-") as tmp, Cluster() as cluster:
        url, pids = start_cluster(cluster, Path(tmp), capacity=batch * SLOTS * n_batches)
        ew = asyncio.run(run_pipeline(url, pids, batch, n_batches, repeats, args.inflight))
    base = best_baseline(batch, n_batches, repeats, rows, args.quick)

    ratio = ew["samples_per_s"] / base["samples_per_s"]
    print_summary(ew, base)
    path = write_json(
        "ew_bench",
        {
            "batch": batch,
            "batches": n_batches,
            "repeats": repeats,
            "inflight": args.inflight,
            "embedding_worker": ew,
            "baseline": base,
            "ratio": ratio,
            "wall_s": time.perf_counter() - t0,
        },
        args.json,
    )
    print(f"JSON: {path}  ({time.perf_counter() - t0:.0f} s)")
    saved(
        save_bar_chart(
            path,
            [
                "embedding worker\n(1 EW + 2 PS, HTTP)",
                f"pytorch step\n({base['torch_threads']} threads)",
            ],
            [ew["samples_per_s"], base["samples_per_s"]],
            title=f"Embedding worker vs a PyTorch step, batch {batch} (ratio {ratio:.2f})",
            ylabel="samples/s (median)",
        )
    )
    print(f"baseline_samples_per_s={base['samples_per_s']:.0f} ratio={ratio:.2f}")
    print(
        f"RESULT ew_samples_per_s={ew['samples_per_s']:.0f} ew_ids_per_s={ew['samples_per_s'] * SLOTS:.0f}"
    )


if __name__ == "__main__":
    main()
