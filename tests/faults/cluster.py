"""A real one-machine cluster for the fuzz and load suites, and the invariants they check.

:class:`Cluster` starts one embedding PS, one embedding worker (slots ``a``: dim 4 summed,
``r``: dim 3 raw) and one NN-worker ingress (:mod:`tests.faults.ingress_host`) as
subprocesses on loopback against the session's redis-server, with request caps of
``cap_bytes``, and primes the PS with trained entries (Adagrad state included).

:meth:`Cluster.send` sends one request and checks, after it: the answer is not a 5xx
other than 503; every process is alive and ``/health`` answers 200; and when the
request was refused (>= 400) nothing it could touch changed: the PS checksum
(``/checksum``) and the worker's buffered / awaiting-gradient counts are as before.
"""

from __future__ import annotations

import collections
import itertools
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER, ROLE_NN_WORKER
from pyrsia.shared.errors import ProtocolError
from tests.faults.fuzz_bodies import UNUSABLE_DIRS
from tests.faults.raw_http import RawClient
from tests.nn_helpers import EMBEDDING_CONFIG, make_batch
from tests.service_procs import ServiceProc

HYPER = {"emb_initialization": [-0.1, 0.1], "admit_probability": 1.0, "weight_bound": 10.0}
OPTIMIZER = {"type": "adagrad", "lr": 0.05}


KNOWN_PATHS = frozenset(
    {
        "/configure",
        "/register_optimizer",
        "/lookup",
        "/update",
        "/dump",
        "/load",
        "/clear",
        "/stats",
        "/checksum",
        "/batch",
        "/lookup_direct",
        "/gradients",
        "/ingress",
        "/done",
        "/health",
        "/metrics",
    }
)


class InvariantError(AssertionError):
    """A request broke one of the invariants in the module docstring."""


def check_answer_and_processes(
    where: str, status: int, answer: Any, procs: dict[str, ServiceProc]
) -> None:
    """The invariants after every hostile request: no 5xx but 503, every process alive and
    healthy (``where`` names the request in the error)."""
    if status >= 500 and status != 503:
        raise InvariantError(f"{where}: answered {status}: {answer!r}")
    for name, proc in procs.items():
        if proc.proc.poll() is not None:
            raise InvariantError(f"{where}: {name} died ({proc.proc.returncode})")
        if proc.health()[0] != 200:
            raise InvariantError(f"{where}: {name} /health says {proc.health()}")


class Cluster:
    def __init__(self, redis_url: str, workdir: Path, *, cap_bytes: int = 1 << 20):
        self.workdir = workdir
        self.sandbox = workdir / "dumps"
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self.env = {
            "PERSIA_REDIS_URL": redis_url,
            "PERSIA_JOB_ID": f"fuzz-{uuid.uuid4().hex[:8]}",
            "PYRSIA_MAX_MESSAGE_BYTES": str(cap_bytes),
            "LOG_LEVEL": "WARNING",
        }
        self.procs: dict[str, ServiceProc] = {}
        self.clients: dict[str, RawClient] = {}
        self.tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        # ids and batch ids from 2**16 up encode to the same width (msgpack uint32), so a
        # template's encoded length never changes and hypothesis' draws stay reproducible
        self.ids = itertools.count(1 << 16)
        self.cap_bytes = cap_bytes

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> Cluster:
        config = self.workdir / "embedding_config.yml"
        config.write_text(EMBEDDING_CONFIG)
        cap = ["--max-request-bytes", str(self.cap_bytes)]
        self.procs["ps"] = ServiceProc.start(
            "pyrsia.services.embedding_ps",
            ["--port", "0", *cap],
            self.env,
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
            log_dir=self.workdir,
        )
        self.procs["ew"] = ServiceProc.start(
            "pyrsia.services.embedding_worker",
            ["--port", "0", "--embedding-config", str(config), *cap],
            self.env,
            role=ROLE_EMBEDDING_WORKER,
            log_dir=self.workdir,
        )
        self.procs["nn"] = ServiceProc.start(
            "tests.faults.ingress_host", [], self.env, role=ROLE_NN_WORKER, log_dir=self.workdir
        )
        for name, proc in self.procs.items():
            self.clients[name] = RawClient(proc.url)
        self._prime()
        return self

    def stop(self) -> dict[str, int]:
        for client in self.clients.values():
            client.close()
        return {name: proc.stop() for name, proc in reversed(self.procs.items())}

    def _prime(self) -> None:
        self.call("ew", "/configure", {"hyperparams": HYPER})
        self.call("ew", "/register_optimizer", {"optimizer": OPTIMIZER})
        for _ in range(4):
            self.train_step(np.arange(1, 65, dtype=np.uint64) + np.uint64(next(self.ids) * 64))
        assert self.call("ps", "/checksum")["entries"] > 0

    # --- valid traffic ----------------------------------------------------------------------
    def call(self, service: str, path: str, body: Any = None) -> Any:
        status, answer = self.clients[service].post(path, None if body is None else packb(body))
        if status != 200:
            raise AssertionError(f"{service}{path}: {status} {answer!r}")
        return answer

    def buffered_batch(self, ids: np.ndarray | None = None) -> int:
        """Send a batch's id part to the worker; return its batch id."""
        batch_id = next(self.ids)
        ids = ids if ids is not None else np.array([batch_id, batch_id + 7], np.uint64)
        self.call(
            "ew",
            "/batch",
            {"loader": 0, "batch_id": batch_id, "batch": make_batch(ids).id_part().to_wire()},
        )
        return batch_id

    def awaiting_batch(self) -> tuple[int, list[dict]]:
        """A batch whose embeddings were handed out; returns (batch id, valid gradients)."""
        batch_id = self.buffered_batch()
        answer = self.call("ew", "/lookup", {"batch_id": batch_id, "train": True})
        grads = [
            {"name": e["name"], "data": np.full(e["data"].shape, 0.01, np.float32)}
            for e in answer["embeddings"]
        ]
        return batch_id, grads

    def awaiting_gathered_batch(self) -> dict:
        """A batch answered gathered (slot ``a`` as a table); returns a valid ``/gradients`` body:
        the table's gradient, and the pooled (raw) slot's."""
        batch_id = self.buffered_batch()
        answer = self.call("ew", "/lookup", {"batch_id": batch_id, "train": True, "gathered": True})
        grads = [
            {"name": e["name"], "data": np.full(e["data"].shape, 0.01, np.float32)}
            for e in answer["embeddings"]
            if "data" in e
        ]
        tables = [
            {"dim": t["dim"], "data": np.full(t["data"].shape, 0.01, np.float32)}
            for t in answer["tables"]
        ]
        return {
            "batch_id": batch_id,
            "loss_scale": 1.0,
            "gradients": grads,
            "tables": tables,
            "skipped_slots": [],
        }

    def train_step(self, ids: np.ndarray) -> None:
        batch_id = self.buffered_batch(ids)
        answer = self.call("ew", "/lookup", {"batch_id": batch_id, "train": True})
        grads = [
            {"name": e["name"], "data": np.full(e["data"].shape, 0.01, np.float32)}
            for e in answer["embeddings"]
        ]
        self.call("ew", "/gradients", {"batch_id": batch_id, "loss_scale": 1.0, "gradients": grads})

    # --- invariants -------------------------------------------------------------------------
    def state(self) -> tuple:
        ps = self.call("ps", "/checksum")
        ew = self.call("ew", "/stats")
        return ps["checksum"], ps["entries"], ew["pending"], ew["awaiting_gradients"]

    def sandboxed(self, path: str, raw: bytes) -> bytes:
        """Keep /dump and /load inside the test's directory whatever the fuzzer wrote."""
        if path not in ("/dump", "/load"):
            return raw
        try:
            body = unpackb(raw)
        except ProtocolError:
            return raw
        if not (isinstance(body, dict) and isinstance(body.get("dir"), str)):
            return raw  # no path to sandbox (the server must refuse it: 400)
        if body["dir"] in UNUSABLE_DIRS:
            return raw  # paths that cannot be written: the server must say 400, not 500
        if body["dir"].startswith(str(self.sandbox)):
            return raw
        body["dir"] = str(self.sandbox / body["dir"].encode("utf-8", "replace").hex()[:64])
        return packb(body)

    def send(self, service: str, path: str, raw: bytes | None, method: str = "POST") -> int:
        """Send one hostile request and check the invariants; returns the status."""
        raw = self.sandboxed(path, raw) if raw is not None else None
        before = self.state()
        status, answer = self.clients[service].request(method, path, raw)
        known = path in KNOWN_PATHS
        self.tally[f"{service} {path if known else '(other paths)'}"][status] += 1
        where = f"{service} {method} {path} with {raw[:300] if raw else raw!r}"
        check_answer_and_processes(where, status, answer, self.procs)
        if status >= 400:
            after = self.state()
            if after != before:
                raise InvariantError(f"{where}: refused ({status}) but state {before} -> {after}")
        return status
