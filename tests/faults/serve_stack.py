"""A real serving stack for the /predict fuzz suite, and the invariants it checks.

:class:`ServeStack` exports a small model (``tests.nn_helpers.SmallModel`` over slots
``a`` and ``r``) whose embedding checkpoint holds entries of both slots' widths, starts
one ``job_type: Infer`` PS replica loading it at a fixed ``infer_config.servers``
address, and ``persia-launcher serve`` with its private embedding worker and a request
cap of ``cap_bytes`` (``--max-request-bytes``). Redis points at a closed port: serving
needs none.

The served state is fingerprinted by :meth:`ServeStack.state`: the PS's ``/checksum``
(BLAKE2b of every stored entry) and the exact bytes of the predictions for a fixed
probe batch (the dense model and the embeddings it is given). :meth:`ServeStack.send`
sends one request and checks after it: no 5xx but 503; serve and the PS alive, their
``/health`` 200; and the fingerprint unchanged (``/predict`` never writes: eval lookups
do not insert, so this holds for accepted requests as well as refused ones).
"""

from __future__ import annotations

import collections
import hashlib
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from persia.serving import export_model
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.shared.codec import packb
from pyrsia.shared.embedding_spec import SGDSpec
from tests.faults.cluster import InvariantError, check_answer_and_processes
from tests.faults.raw_http import RawClient
from tests.nn_helpers import EMBEDDING_CONFIG, SmallModel, make_batch
from tests.redis_server import free_port
from tests.service_procs import ServiceProc

NO_REDIS = "redis://127.0.0.1:1/0"
PROBE_IDS = list(range(1, 33))


def predict_body(batch) -> dict:
    """The msgpack ``/predict`` body of a PersiaBatch (slot ``a`` single ids, ``r`` CSR)."""
    a, r = batch.id_type_features
    dense = np.asarray(batch.non_id_type_features[0].data)
    return {
        "non_id": {"non_id_0": dense},
        "ids": {"a": a.ids, "r": {"ids": r.ids, "offsets": r.offsets}},
    }


def _export(root: Path) -> Path:
    (root / "embedding_config.yml").write_text(EMBEDDING_CONFIG)
    store = EmbeddingStore(10_000, optimizer=SGDSpec(lr=0.1))
    ids = np.arange(1, 2000, dtype=np.uint64) * np.uint64(2654435761)
    store.lookup(ids, 4, train=True)
    store.lookup(ids, 3, train=True)
    store.dump(root / "ckpt", 0, 1)
    g = np.random.default_rng(0)
    non_id = [torch.from_numpy(g.normal(size=(3, 2)).astype(np.float32))]
    emb = [
        torch.from_numpy(g.normal(size=(3, 4)).astype(np.float32)),
        torch.from_numpy(g.normal(size=(3, 2, 4)).astype(np.float32)),
    ]
    torch.manual_seed(0)
    return export_model(
        root / "model",
        SmallModel(),
        example_inputs=(non_id, emb),
        embedding_config=root / "embedding_config.yml",
        embedding_checkpoint_dir=root / "ckpt",
    )


def artifact_digest(export: Path) -> str:
    """BLAKE2b over every file of the export directory (names and bytes)."""
    h = hashlib.blake2b(digest_size=16)
    for path in sorted(p for p in export.rglob("*") if p.is_file()):
        h.update(str(path.relative_to(export)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class ServeStack:
    def __init__(
        self,
        workdir: Path,
        *,
        cap_bytes: int = 1 << 20,
        host: str = "127.0.0.1",
        token: str | None = None,
    ):
        """``token``: the job's ``PERSIA_AUTH_TOKEN`` (every process gets it, and every
        request this class sends carries it); ``host``: serve's ``--host``."""
        self.workdir = workdir
        self.cap_bytes = cap_bytes
        self.host = host
        self.env = {
            "PERSIA_REDIS_URL": NO_REDIS,
            "PERSIA_JOB_ID": f"fuzz-{uuid.uuid4().hex[:8]}",
            "LOG_LEVEL": "WARNING",
        }
        self.headers: dict[str, str] = {}
        if token is not None:
            self.env["PERSIA_AUTH_TOKEN"] = token
            self.headers["Authorization"] = f"Bearer {token}"
        self.procs: dict[str, ServiceProc] = {}
        self.tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.probe = predict_body(make_batch(PROBE_IDS, requires_grad=False, seed=7))
        self.export: Path | None = None
        self.client: RawClient | None = None
        self.ps_client: RawClient | None = None

    def start(self) -> ServeStack:
        self.export = _export(self.workdir)
        ps_port, serve_port = free_port(), free_port()
        infer = self.workdir / "infer.yml"
        infer.write_text(
            f"common_config:\n  job_type: Infer\n  infer_config:\n    servers:\n"
            f"    - 127.0.0.1:{ps_port}\n    embedding_checkpoint: {self.export / 'embedding'}\n"
        )
        self.procs["ps"] = ServiceProc.start(
            "pyrsia.services.embedding_ps",
            ["--global-config", str(infer), "--port", str(ps_port)],
            self.env,
            role="infer_ps",
            address=f"127.0.0.1:{ps_port}",
            log_dir=self.workdir,
        )
        self.procs["serve"] = ServiceProc.start(
            "persia.launcher",
            [
                "serve",
                "--model",
                str(self.export),
                "--global-config",
                str(infer),
                "--port",
                str(serve_port),
                "--max-request-bytes",
                str(self.cap_bytes),
                "--host",
                self.host,
            ],
            self.env,
            role="serve",
            address=f"127.0.0.1:{serve_port}",
            log_dir=self.workdir,
        )
        self.client = RawClient(self.procs["serve"].url)
        self.ps_client = RawClient(self.procs["ps"].url)
        self.before = self.state()
        assert self.before[1] > 0, "the Infer PS loaded no entries"
        self.artifact = artifact_digest(self.export)
        return self

    def stop(self) -> dict[str, int]:
        for client in (self.client, self.ps_client):
            if client is not None:
                client.close()
        return {name: proc.stop() for name, proc in reversed(self.procs.items())}

    def predict(self, body: dict) -> tuple[int, Any]:
        assert self.client is not None
        return self.client.request("POST", "/predict", packb(body), self.headers)

    def state(self) -> tuple[str, int, bytes]:
        """(PS checksum, PS entries, bytes of the probe's predictions)."""
        assert self.ps_client is not None
        status, ps = self.ps_client.request("POST", "/checksum", packb({}), self.headers)
        if status != 200:
            raise InvariantError(f"PS /checksum answered {status}: {ps!r}")
        status, answer = self.predict(self.probe)
        if status != 200:
            raise InvariantError(f"the probe prediction answered {status}: {answer!r}")
        outputs = np.ascontiguousarray(answer["outputs"]["output_0"], np.float32)
        return ps["checksum"], ps["entries"], outputs.tobytes()

    def send(
        self,
        raw: bytes | None,
        *,
        content_type: str = "application/msgpack",
        method: str = "POST",
        path: str = "/predict",
    ) -> int:
        """Send one hostile request, check the invariants, return the status."""
        assert self.client is not None
        headers = {"Content-Type": content_type, **self.headers}
        status, answer = self.client.request(method, path, raw, headers)
        key = path if path in ("/predict", "/signature", "/health", "/metrics") else "(other)"
        self.tally[f"serve {key} {content_type}"][status] += 1
        where = f"serve {method} {path} ({content_type}) with {raw[:300] if raw else raw!r}"
        check_answer_and_processes(where, status, answer, self.procs)
        if self.state() != self.before:
            raise InvariantError(f"{where}: answered {status} but the served state changed")
        return status
