"""CPU per batch of the embedding worker, the PS and the NN side: gradients on their own
``/gradients`` request against gradients carried on the next ``/lookup``.

One real redis-server, PS and embedding worker (subprocesses), Census-Income's shape: 33
single-id slots of dim 16, 1,024 rows a batch, ~16 distinct ids per slot, the PS configured
as ``benchmarks/e2e_bench.py`` configures it. The client is the
NN worker's own ``EmbeddingClient`` over HTTP, one batch at a time as a rank's step makes
them: ``separate`` looks a batch up and then sends its gradients on ``/gradients``;
``carried`` looks a batch up carrying the previous batch's gradients
(``pyrsia.services.nn_worker.carry``). The same servers serve both modes, in alternating
rounds (the first round of each is a warm-up), so both see the same machine load. Around
each round it reads the worker's and the PS's CPU from ``/proc``, their voluntary context
switches (wake-ups) and the client's ``time.process_time()``. Ends with::

    RESULT separate_cpu_ms=... carried_cpu_ms=... saved_cpu_ms=...

    python benchmarks/carry_cpu_bench.py [--rounds 21] [--batches 60]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import Cluster, cpu_seconds

from persia.embedding.data import IDTypeFeatureWithSingleID, Label, PersiaBatch
from pyrsia.services.nn_worker.embedding_client import EmbeddingClient
from pyrsia.services.nn_worker.http_transport import HttpEmbeddingTransport
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.http_server import install_uvloop
from pyrsia.shared.wire.batch import IDPart
from pyrsia.shared.wire.worker import Embeddings, Gradients, PutBatch

SLOTS, ROWS, VOCAB, DIM = 33, 1024, 16, 16
MODES = ("separate", "carried")
GLOBAL_YML = """common_config:
  job_type: Train
embedding_parameter_server_config:
  capacity: 2096
  num_hashmap_internal_shards: 1
embedding_worker_config:
  forward_buffer_size: 1000
"""


def write_configs(into: Path) -> list[str]:
    """The job's YAML files; the servers' flags."""
    slots = "".join(f"  s{k}: {{dim: {DIM}}}\n" for k in range(SLOTS))
    (into / "embedding_config.yml").write_text("slots_config:\n" + slots)
    (into / "global_config.yml").write_text(GLOBAL_YML)
    return [
        *("--port", "0", "--embedding-config", str(into / "embedding_config.yml")),
        *("--global-config", str(into / "global_config.yml")),
    ]


def id_part(seed: int) -> IDPart:
    rng = np.random.default_rng(seed)
    features = [
        IDTypeFeatureWithSingleID(f"s{k}", rng.integers(0, VOCAB, ROWS).astype(np.uint64))
        for k in range(SLOTS)
    ]
    labels = [Label(np.zeros((ROWS, 1), np.float32))]
    return PersiaBatch(features, labels=labels, requires_grad=True).id_part()


def gradients(answer: Embeddings, batch_id: int) -> Gradients:
    """A small gradient for every slot of ``answer`` (gathered slots as table sums)."""
    gathered = {name for t in answer.tables for name in t.slots}
    slots = tuple(
        (n, np.full_like(np.asarray(d), 1e-3)) for n, d in answer.embeddings if n not in gathered
    )
    tables = tuple((t.dim, np.full_like(t.data, 1e-3)) for t in answer.tables) or None
    return Gradients(batch_id, 1.0, slots, tables)


def wakeups(pid: int) -> int:
    """Voluntary context switches of every thread of ``pid``."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as fh:
            total += sum(int(line.split()[1]) for line in fh if line.startswith("voluntary_ctxt"))
    return total


async def train_round(client: EmbeddingClient, ids: range, mode: str) -> None:
    """Look every batch of ``ids`` up and return its gradients, as ``mode`` does."""
    previous = None
    for k in ids:
        if mode == "separate":
            answer, _ = await client.lookup(0, k, True, ROWS, gathered=True)
            await client.send_gradients(0, gradients(answer, k))
            continue
        if previous is not None:
            client.carry_gradients(0, gradients(*previous))
        answer, _ = await client.lookup(0, k, True, ROWS, gathered=True, carry=True)
        previous = (answer, k)
    if previous is not None:
        await client.send_gradients(0, gradients(*previous))


async def measure(flags: list[str], rounds: int, batches: int) -> dict[str, dict[str, float]]:
    """Per mode: CPU-ms and wake-ups per batch of the worker, the PS and the client."""
    install_uvloop()
    cluster = Cluster()
    ps = cluster.start(
        "pyrsia.services.embedding_ps", flags, role=ROLE_EMBEDDING_PS, wait_ready=False
    )
    ew = cluster.start("pyrsia.services.embedding_worker", flags, role=ROLE_EMBEDDING_WORKER)
    http = HttpClient(retries=0)
    client = EmbeddingClient(HttpEmbeddingTransport(http, addresses=[ew.url]))
    totals = {
        m: dict.fromkeys(("ew", "ps", "client", "ew_wakeups", "ps_wakeups", "n"), 0.0)
        for m in MODES
    }
    bodies = [id_part(seed) for seed in range(8)]

    def reading() -> tuple[float, ...]:
        pids = (ew.proc.pid, ps.proc.pid)
        return (*map(cpu_seconds, pids), time.process_time(), *map(wakeups, pids))

    try:
        await client.configure({"emb_initialization": [-0.01, 0.01], "admit_probability": 1.0})
        await client.register_optimizer({"type": "adagrad", "lr": 0.05})
        next_id = 0
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                ids = range(next_id, next_id + batches)
                next_id += batches
                for k in ids:
                    await http.call(f"{ew.url}/batch", PutBatch(0, k, bodies[k % 8]).to_wire())
                before = reading()
                await train_round(client, ids, mode)
                after = reading()
                if r > 0:  # the first round of each mode warms up
                    for key, a, b in zip(list(totals[mode])[:5], before, after, strict=True):
                        totals[mode][key] += b - a
                    totals[mode]["n"] += batches
    finally:
        await http.close()
        cluster.stop()
    return {
        m: {
            k: (1e3 if k in ("ew", "ps", "client") else 1) * v / t["n"]
            for k, v in t.items()
            if k != "n"
        }
        for m, t in totals.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds per mode (first: warm-up)")
    parser.add_argument("--batches", type=int, default=60, help="batches per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result = asyncio.run(measure(write_configs(Path(tmp)), args.rounds, args.batches))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"per batch, {args.batches} batches x {args.rounds - 1} rounds a mode; load average {load}"
    )
    for mode, row in result.items():
        cpu = row["ew"] + row["ps"] + row["client"]
        print(
            f"  {mode:8s} worker {row['ew']:.3f} CPU-ms ({row['ew_wakeups']:.2f} wake-ups), "
            f"PS {row['ps']:.3f} ({row['ps_wakeups']:.2f}), client {row['client']:.3f}; sum {cpu:.3f}"
        )
    sums = {m: r["ew"] + r["ps"] + r["client"] for m, r in result.items()}
    print(
        f"RESULT separate_cpu_ms={sums['separate']:.3f} carried_cpu_ms={sums['carried']:.3f} "
        f"saved_cpu_ms={sums['separate'] - sums['carried']:.3f}"
    )


if __name__ == "__main__":
    main()
