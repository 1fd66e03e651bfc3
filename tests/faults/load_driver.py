"""Drive an embedding worker (and through it its PS) at a fixed rate of training steps.

``python -m tests.faults.load_driver --ew URL --seconds S --steps-per-s R`` plays the
data loader and the NN worker of the Adult demo at R training steps per second: each
step is ``/batch`` (128 samples, the 8 categorical slots of examples/adult_income with
Adult-sized vocabularies) + ``/lookup`` (train) + ``/gradients``; one evaluation
``/lookup_direct`` goes with every 16 steps (the demo's 16 test batches per 255 training
batches). Steps start on an open-loop schedule (step k at k / R seconds) with at most
``--concurrency`` in flight; the JSON it prints has, per route, the count, errors and
latency percentiles (send to answer, milliseconds), the achieved rates, and how many
steps started late because the in-flight bound was reached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict

import msgpack
import numpy as np

from persia.embedding.data import IDTypeFeatureWithSingleID, Label, PersiaBatch
from pyrsia.shared.codec import packb
from pyrsia.shared.errors import PersiaError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.http_server import install_uvloop

SLOTS = {
    "workclass": 9,
    "education": 16,
    "marital_status": 7,
    "occupation": 15,
    "relationship": 6,
    "race": 5,
    "gender": 2,
    "native_country": 42,
}
"""Slot -> vocabulary size (distinct values in UCI Adult's training split, plus 'unseen')."""
BATCH = 128
DIM = 8
EVAL_EVERY = 16


def adult_like_batches(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        features = [
            IDTypeFeatureWithSingleID(name, rng.integers(0, vocab + 1, BATCH, dtype=np.uint64))
            for name, vocab in SLOTS.items()
        ]
        labels = [Label(rng.integers(0, 2, (BATCH, 1)).astype(np.float32))]
        out.append(PersiaBatch(features, labels=labels, requires_grad=True).id_part().to_wire())
    return out


def _header(n: int) -> bytes:
    return msgpack.Packer().pack_map_header(n)


def _key(name: str) -> bytes:
    return msgpack.packb(name)


def _map(*pairs: tuple[str, object]) -> bytes:
    """The encoded key/value pairs of a map (its header is written separately)."""
    return b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)


class StepBodies:
    """The encoded request bodies of one training step, built once and spliced per step.

    The arrays are encoded once and spliced with the step's batch id, so a client's own
    CPU goes to HTTP, not to re-encoding the same arrays (the benchmark
    ``benchmarks/request_cpu_bench.py`` uses the same bodies).
    """

    def __init__(self, n_batches: int = 64):
        batches = adult_like_batches(n_batches)
        grads = [{"name": n, "data": np.full((BATCH, DIM), 1e-3, np.float32)} for n in SLOTS]
        self.batches = [packb(b) for b in batches]
        self.grads = packb(grads)
        self.eval_body = packb({"batch": {**batches[0], "requires_grad": False}, "train": False})

    def batch(self, k: int) -> bytes:
        """``/batch``: loader 0, batch id ``k``."""
        body = _map(("loader", 0), ("batch_id", k)) + _key("batch")
        return _header(3) + body + self.batches[k % len(self.batches)]

    def lookup(self, k: int) -> bytes:
        """``/lookup`` (train) of batch ``k``."""
        return packb({"batch_id": k, "train": True})

    def gradients(self, k: int) -> bytes:
        """``/gradients`` of batch ``k`` (every slot, loss scale 1)."""
        body = _map(("batch_id", k), ("loss_scale", 1.0)) + _key("gradients")
        return _header(3) + body + self.grads


class Driver:
    def __init__(self, ew: str, concurrency: int):
        self.ew = ew.rstrip("/")
        self.http = HttpClient(retries=0, pool_limit=concurrency)
        self.latency: dict[str, list[float]] = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.bodies = StepBodies()

    async def timed(self, route: str, encoded: bytes) -> dict | None:
        started = time.perf_counter()
        try:
            answer = await self.http.call(f"{self.ew}{route}", encoded=encoded)
        except PersiaError as exc:
            self.errors[f"{route}: {type(exc).__name__}"] += 1
            return None
        self.latency[route].append(time.perf_counter() - started)
        return answer

    async def step(self, k: int) -> None:
        if await self.timed("/batch", self.bodies.batch(k)) is None:
            return
        if await self.timed("/lookup", self.bodies.lookup(k)) is None:
            return
        await self.timed("/gradients", self.bodies.gradients(k))
        if k % EVAL_EVERY == 0:
            await self.timed("/lookup_direct", self.bodies.eval_body)

    async def run(self, seconds: float, rate: float, concurrency: int) -> dict:
        hyper = {"emb_initialization": [-0.01, 0.01], "admit_probability": 1.0}
        await self.http.call(f"{self.ew}/configure", {"hyperparams": hyper})
        await self.http.call(
            f"{self.ew}/register_optimizer", {"optimizer": {"type": "adagrad", "lr": 0.05}}
        )
        cpu_start = time.process_time()
        slots = asyncio.Semaphore(concurrency)
        tasks: set[asyncio.Task] = set()
        late = 0
        start = time.monotonic()
        k = 0
        while True:
            due = start + k / rate
            now = time.monotonic()
            if due - start >= seconds or now - start >= seconds:
                break  # the run lasts ``seconds`` even when the rate cannot be kept
            if due > now:
                await asyncio.sleep(due - now)
            if slots.locked():
                late += 1
            await slots.acquire()
            task = asyncio.create_task(self.step(k))
            tasks.add(task)
            task.add_done_callback(lambda t: (tasks.discard(t), slots.release()))
            k += 1
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
        await self.http.close()
        report = self.report(k, elapsed, rate, late)
        report["driver_cpu_share"] = round((time.process_time() - cpu_start) / elapsed, 2)
        return report

    def report(self, steps: int, elapsed: float, rate: float, late: int) -> dict:
        routes = {}
        for route, values in sorted(self.latency.items()):
            ms = np.array(values) * 1e3
            routes[route] = {
                "count": len(values),
                "p50_ms": round(float(np.percentile(ms, 50)), 2),
                "p90_ms": round(float(np.percentile(ms, 90)), 2),
                "p99_ms": round(float(np.percentile(ms, 99)), 2),
                "max_ms": round(float(ms.max()), 2),
            }
        ew_requests = sum(r["count"] for r in routes.values())
        train = routes.get("/gradients", {}).get("count", 0)
        evals = routes.get("/lookup_direct", {}).get("count", 0)
        return {
            "seconds": round(elapsed, 1),
            "target_steps_per_s": rate,
            "steps_started": steps,
            "steps_started_late": late,
            "ew_requests_per_s": round(ew_requests / elapsed, 1),
            "ps_requests_per_s": round((2 * train + evals) / elapsed, 1),  # /lookup, /update
            "errors": dict(self.errors),
            "routes": routes,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ew", required=True, help="embedding worker URL")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--steps-per-s", type=float, required=True)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    install_uvloop()
    driver = Driver(args.ew, args.concurrency)
    print(json.dumps(asyncio.run(driver.run(args.seconds, args.steps_per_s, args.concurrency))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
