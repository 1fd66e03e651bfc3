"""CPU per request, per route, of the embedding worker and the PS: working tree vs a baseline.

The load test (``tests/faults/test_load.py``) needs ~2,300 worker and ~1,500 PS requests/s
on a 2-core machine that also runs the client, so what limits it is CPU per request, not
latency. This benchmark measures exactly that, for the working tree and for a baseline
commit (``--baseline-ref``, unpacked with ``git archive`` and run through
``benchmarks/run_source.py``) in the same run, so the ratios hold on a shared machine.

For each tree: a real redis-server, one PS and one embedding worker (the Adult demo's
configs) as subprocesses. The client sends the load driver's bodies
(``tests.faults.load_driver.StepBodies``: 128 samples x 8 slots, dim 8) in rounds of
``--round`` batches with ``--concurrency`` requests in flight, one route at a time:
``/batch`` x round, ``/lookup`` (train) x round, ``/gradients`` x round,
``/lookup_direct`` (eval) x round. Around each phase it reads the worker's and the PS's
user+system CPU from ``/proc`` and the client's own ``time.process_time()``; the table
gives CPU-ms per request of each process for each route (the PS's column is the PS work
the worker route caused: one PS /lookup or /update per request; the client's column is
aiohttp's client for the baseline, ``HttpClient``'s lean pool for the working tree, as the
load driver uses them). Trees alternate round
by round, so both see the same machine load. Writes ``bench_results/request_cpu-*.json``
and ends with::

    RESULT ew_cpu_ms_per_step=... ps_cpu_ms_per_step=... ratio_ew=... ratio_ps=...

(a step = /batch + /lookup + /gradients + 1/16 /lookup_direct, the load driver's unit;
ratios are baseline / working tree, so > 1 is a saving).

    python benchmarks/request_cpu_bench.py [--baseline-ref main] [--rounds 20] [--round 200] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import subprocess
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import REPO, Cluster, cpu_seconds, print_table, write_json
from plots import save_bar_chart, saved

from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.http_server import install_uvloop
from tests.faults.load_driver import EVAL_EVERY, StepBodies

ROUTES = ("/batch", "/lookup", "/gradients", "/lookup_direct")
CONFIG = REPO / "examples/adult_income/config"


def unpack_ref(ref: str, into: Path) -> str:
    """Unpack commit ``ref`` of this repository into ``into``; its full hash."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", ref], check=True, capture_output=True, text=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", commit], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


class Tree:
    """One PS + one embedding worker started from a source tree (None: the working tree)."""

    def __init__(self, name: str, source: Path | None):
        self.name = name
        self.cluster = Cluster()
        launcher = ["benchmarks.run_source", str(source)] if source is not None else None
        flags = [
            "--port",
            "0",
            "--embedding-config",
            str(CONFIG / "embedding_config.yml"),
            "--global-config",
            str(CONFIG / "global_config.yml"),
        ]
        self.ps = self.cluster.start(
            "pyrsia.services.embedding_ps",
            flags,
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
            python_args=launcher,
        )
        self.ew = self.cluster.start(
            "pyrsia.services.embedding_worker",
            flags,
            role=ROLE_EMBEDDING_WORKER,
            python_args=launcher,
        )
        # the baseline's client is the baseline's: aiohttp for every call
        self.http = HttpClient(retries=0, lean=source is None)
        self.cpu: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.requests: dict[str, int] = defaultdict(int)
        self.next_id = 0

    async def setup(self) -> None:
        hyper = {"emb_initialization": [-0.01, 0.01], "admit_probability": 1.0}
        await self.http.call(f"{self.ew.url}/configure", {"hyperparams": hyper})
        optimizer = {"optimizer": {"type": "adagrad", "lr": 0.05}}
        await self.http.call(f"{self.ew.url}/register_optimizer", optimizer)

    def _cpu(self) -> dict[str, float]:
        return {
            "ew": cpu_seconds(self.ew.proc.pid),
            "ps": cpu_seconds(self.ps.proc.pid),
            "client": time.process_time(),
        }

    async def phase(self, route: str, bodies: list[bytes], concurrency: int, record: bool) -> None:
        slots = asyncio.Semaphore(concurrency)

        async def send(body: bytes) -> None:
            async with slots:
                await self.http.call(f"{self.ew.url}{route}", encoded=body)

        before = self._cpu()
        await asyncio.gather(*(send(b) for b in bodies))
        after = self._cpu()
        if record:
            for proc in before:
                self.cpu[route][proc] += after[proc] - before[proc]
            self.requests[route] += len(bodies)

    async def round(self, steps: StepBodies, size: int, concurrency: int, record: bool) -> None:
        ids = range(self.next_id, self.next_id + size)
        self.next_id += size
        await self.phase("/batch", [steps.batch(k) for k in ids], concurrency, record)
        await self.phase("/lookup", [steps.lookup(k) for k in ids], concurrency, record)
        await self.phase("/gradients", [steps.gradients(k) for k in ids], concurrency, record)
        await self.phase("/lookup_direct", [steps.eval_body] * size, concurrency, record)

    def per_request_ms(self) -> dict[str, dict[str, float]]:
        return {
            route: {
                p: 1e3 * self.cpu[route][p] / self.requests[route] for p in ("ew", "ps", "client")
            }
            for route in ROUTES
        }

    async def close(self) -> list[int]:
        await self.http.close()
        return self.cluster.stop()


def per_step(ms: dict[str, dict[str, float]], proc: str) -> float:
    """CPU-ms of ``proc`` per load-driver step (3 training requests + 1/16 eval lookup)."""
    train = sum(ms[r][proc] for r in ("/batch", "/lookup", "/gradients"))
    return train + ms["/lookup_direct"][proc] / EVAL_EVERY


async def run(args: argparse.Namespace, sources: dict[str, Path | None]) -> dict[str, Any]:
    trees = [Tree(name, source) for name, source in sources.items()]
    codes: dict[str, list[int]] = {}
    try:
        steps = StepBodies()
        for tree in trees:
            await tree.setup()
            await tree.round(steps, args.round, args.concurrency, record=False)  # warm-up (numba)
        for _ in range(args.rounds):
            for tree in trees:
                await tree.round(steps, args.round, args.concurrency, record=True)
    finally:
        for tree in trees:
            codes[tree.name] = await tree.close()
    return {
        "per_request_ms": {t.name: t.per_request_ms() for t in trees},
        "requests_per_route": {t.name: dict(t.requests) for t in trees},
        "exit_codes": codes,
    }


def _ratio(base: float, new: float) -> str:
    """``base / new`` to 2 places, or '-' when too little CPU was used to say (< 0.01 ms)."""
    return f"{base / new:.2f}" if min(base, new) >= 0.01 else "-"


def report(result: dict[str, Any], base: str | None) -> dict[str, float]:
    ms = result["per_request_ms"]
    rows = []
    for route in ROUTES:
        for name in ms:
            row = {"route": route, "tree": name}
            for proc in ("ew", "ps", "client"):
                row[proc] = f"{ms[name][route][proc]:.3f}"
                if base is not None and name != base:
                    row[f"{proc}_ratio"] = _ratio(ms[base][route][proc], ms[name][route][proc])
            rows.append(row)
    columns = [
        ("route", "route"),
        ("tree", "tree"),
        ("ew", "worker CPU-ms"),
        ("ps", "PS CPU-ms"),
        ("client", "client CPU-ms"),
    ]
    if base is not None:
        columns += [("ew_ratio", "worker x"), ("ps_ratio", "PS x"), ("client_ratio", "client x")]
    print("CPU-ms per request (ratio = baseline / working tree; > 1 is a saving)")
    print_table(rows, columns)
    summary = {
        "ew_cpu_ms_per_step": per_step(ms["working"], "ew"),
        "ps_cpu_ms_per_step": per_step(ms["working"], "ps"),
        "client_cpu_ms_per_step": per_step(ms["working"], "client"),
    }
    if base is not None:
        for proc in ("ew", "ps", "client"):
            summary[f"ratio_{proc}"] = per_step(ms[base], proc) / per_step(ms["working"], proc)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline-ref",
        default="main",
        help="commit to compare with ('none': the working tree alone)",
    )
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds per tree")
    parser.add_argument("--round", type=int, default=200, help="batches per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke size: 2 rounds of 50, baseline HEAD (the tests use it)",
    )
    parser.add_argument(
        "--json", type=Path, help="where to write the JSON (default bench_results/)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.round, args.baseline_ref = 2, 50, "HEAD"
    install_uvloop()
    with tempfile.TemporaryDirectory(prefix="pyrsia-baseline-") as tmp:
        sources: dict[str, Path | None] = {"working": None}
        commit = None
        if args.baseline_ref != "none":
            commit = unpack_ref(args.baseline_ref, Path(tmp))
            sources = {"baseline": Path(tmp), **sources}
        result = asyncio.run(run(args, sources))
    base = "baseline" if commit else None
    summary = report(result, base)
    steps_per_core_s = 1e3 / (
        summary["ew_cpu_ms_per_step"]
        + summary["ps_cpu_ms_per_step"]
        + summary["client_cpu_ms_per_step"]
    )
    print(f"baseline: {args.baseline_ref} ({commit})" if commit else "no baseline")
    print(f"one core runs ~{steps_per_core_s:.0f} load-driver steps/s of worker + PS + client")
    doc = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "baseline_commit": commit,
        "summary": summary,
        **result,
    }
    path = write_json("request_cpu", doc, args.json)
    print(f"wrote {path}")
    procs = {"ew": "embedding worker", "ps": "PS", "client": "client"}
    per_tree = {
        tree: [per_step(ms, p) for p in procs] for tree, ms in result["per_request_ms"].items()
    }
    saved(
        save_bar_chart(
            path,
            list(procs.values()),
            per_tree,
            title="CPU-ms per training step, per process",
            ylabel="CPU ms per step",
        )
    )
    print("RESULT " + " ".join(f"{k}={v:.3f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
