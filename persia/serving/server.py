"""The prediction endpoint of ``persia-launcher serve``: an aiohttp app around one exported model.

::

    client ──POST /predict (msgpack | JSON)──▶ serve ──/lookup_direct (eval)──▶ embedding worker(s)
                                                │                                 │ routes, pools
                                                │◀── one tensor per slot ─────────┘ PS replicas (Infer)
                                                └─ dense model (thread) ─▶ {"outputs": {...}}

Routes: ``POST /predict`` (body: :mod:`pyrsia.shared.wire.serve`), ``GET /signature`` (the
model's ``signature.json``), ``GET /health`` (ready once every embedding worker is ready and
serves the model's embedding schema), ``GET /metrics``. Bad input is a 400 naming the field,
in the request's own format (JSON errors for JSON requests). At most ``max_inflight``
predictions run at once; more are answered 429 so clients back off.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import prometheus_client as prom
from aiohttp import web

from persia.serving.artifact import ServingModel
from pyrsia.services.nn_worker.embedding_client import EmbeddingWorkerClient
from pyrsia.shared.auth import auth_token_from_env
from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.constants import (
    DEFAULT_WAIT_TIMEOUT_S,
    MAX_BATCH_SIZE,
    MSGPACK_CONTENT_TYPE,
    SERVE_MAX_INFLIGHT,
    SERVE_THREADS,
)
from pyrsia.shared.constants import SERVE_SCHEMA_TIMEOUT_S as SCHEMA_TIMEOUT_S
from pyrsia.shared.errors import BackPressureError, PersiaError, ProtocolError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.http_server import METRICS, STATE, make_app, read_body, require_ready
from pyrsia.shared.settings import Settings
from pyrsia.shared.wire.serve import PredictAnswer, PredictRequest
from pyrsia.shared.wire.worker import WorkerSchema

__all__ = ["SERVE", "ServeState", "create_app"]

log = logging.getLogger(__name__)


class ServeState:
    """The model, the embedding-worker client, the dense-model threads and the metrics."""

    def __init__(
        self,
        model: ServingModel,
        addresses: list[str],
        *,
        max_batch: int,
        max_inflight: int,
        threads: int,
    ):
        self.model = model
        self.inputs = model.signature.predict_inputs(max_batch)
        self.addresses = addresses
        self.max_batch = max_batch
        self.max_inflight = max_inflight
        self.threads = threads
        self.inflight = 0
        self.http: HttpClient | None = None
        self.client: EmbeddingWorkerClient | None = None
        self.executor: ThreadPoolExecutor | None = None
        self.metrics: dict[str, Any] = {}


SERVE = web.AppKey("serve_state", ServeState)


def _wants_json(request: web.Request) -> bool:
    return request.content_type == "application/json"


def _respond(request: web.Request, body: dict, status: int = 200) -> web.Response:
    if _wants_json(request):
        return web.json_response(body, status=status)
    return web.Response(status=status, body=packb(body), content_type=MSGPACK_CONTENT_TYPE)


def _error(request: web.Request, exc: PersiaError) -> web.Response:
    body: dict[str, Any] = {"error": getattr(exc, "kind", type(exc).__name__), "message": str(exc)}
    for key in ("field", "expected"):
        if hasattr(exc, key):
            body[key] = getattr(exc, key)
    return _respond(request, body, exc.status)


def _decode(request: web.Request, raw: bytes) -> Any:
    if _wants_json(request):
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"body: invalid JSON: {exc}") from exc
    if request.content_type not in (MSGPACK_CONTENT_TYPE, "application/octet-stream", ""):
        raise ProtocolError(
            f"Content-Type {request.content_type!r}: expected application/msgpack or application/json"
        )
    return unpackb(raw, max_bytes=request.app[STATE].max_body_bytes)


async def predict(request: web.Request) -> web.Response:
    """Predictions of one batch: embeddings from the workers, then the dense model."""
    state = request.app[SERVE]
    m = state.metrics
    started = time.perf_counter()
    try:
        require_ready(request)
        if state.inflight >= state.max_inflight:
            raise BackPressureError(
                f"{state.max_inflight} predictions already running; retry shortly"
            )
        state.inflight += 1
        try:
            parsed = PredictRequest.from_wire(
                _decode(request, await read_body(request)), state.inputs
            )
            looked_up = time.perf_counter()
            looked, _ = await state.client.lookup_direct(parsed.id_part, False)
            embeddings = looked.embeddings
            m["stage"].labels(stage="lookup").observe(time.perf_counter() - looked_up)
            names = [name for name, _ in embeddings]
            if names != list(state.model.signature.id_slots):
                raise ProtocolError(
                    f"embedding worker answered slots {names}, the model takes {list(state.model.signature.id_slots)}"
                )
            arrays = [a if a.dtype == np.float32 else a.astype(np.float32) for _, a in embeddings]
            dense_started = time.perf_counter()
            loop = asyncio.get_running_loop()
            outputs = await loop.run_in_executor(
                state.executor, state.model.predict_numpy, parsed.non_id_arrays, arrays
            )
            m["stage"].labels(stage="dense").observe(time.perf_counter() - dense_started)
        finally:
            state.inflight -= 1
    except PersiaError as exc:
        m["requests"].labels(outcome=str(exc.status)).inc()
        if exc.status >= 500:
            log.warning("predict failed: %s", exc)
        return _error(request, exc)
    names = [s.name for s in state.model.signature.outputs]
    answer = PredictAnswer(parsed.batch_size, tuple(zip(names, outputs, strict=True)))
    m["requests"].labels(outcome="200").inc()
    m["samples"].inc(parsed.batch_size)
    m["stage"].labels(stage="total").observe(time.perf_counter() - started)
    return _respond(request, answer.to_wire(as_json=_wants_json(request)))


async def signature(request: web.Request) -> web.Response:
    """The model's signature.json: input names, dtypes, shapes, slots, outputs."""
    return web.json_response(request.app[SERVE].model.signature.to_dict())


async def _check_workers(app: web.Application, wait_timeout_s: float) -> None:
    """Wait for the embedding workers, then check they serve the model's embedding schema."""
    state, status = app[SERVE], app[STATE]
    try:
        await state.client.wait_ready(wait_timeout_s)
        for url in state.client.urls:
            answer = await state.http.call(
                f"{url}/schema", {}, idempotent=True, timeout_s=SCHEMA_TIMEOUT_S
            )
            if WorkerSchema.from_wire(answer, peer=url).schema != state.model.schema:
                raise ProtocolError(
                    f"embedding worker {url} serves another embedding config than the model was "
                    "trained with; start it with the model's embedding_config.yml"
                )
    except PersiaError as exc:
        status.set_not_ready(str(exc))
        log.error("not serving: %s", exc)
        return
    status.details["embedding_workers"] = state.client.urls
    status.set_ready()
    log.info(
        "serving %s through embedding worker(s) %s", state.model.path, ", ".join(state.client.urls)
    )


def _metrics(app: web.Application) -> dict[str, Any]:
    reg = app[METRICS]
    return {
        "requests": prom.Counter(
            "pyrsia_serve_requests", "predict requests by HTTP status", ["outcome"], registry=reg
        ),
        "samples": prom.Counter("pyrsia_serve_samples", "samples predicted", registry=reg),
        "stage": prom.Histogram(
            "pyrsia_serve_seconds",
            "predict time by stage (lookup, dense, total)",
            ["stage"],
            registry=reg,
        ),
    }


def create_app(
    model: ServingModel,
    embedding_workers: list[str],
    *,
    max_batch: int = MAX_BATCH_SIZE,
    max_inflight: int = SERVE_MAX_INFLIGHT,
    threads: int = SERVE_THREADS,
    wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    max_request_bytes: int | None = None,
    settings: Settings,
) -> web.Application:
    """The serve app: ``model`` answered through the embedding workers at ``embedding_workers``.

    ``max_request_bytes`` caps request bodies (413 beyond; default ``PYRSIA_MAX_MESSAGE_BYTES``
    or 1 GiB); with ``PERSIA_AUTH_TOKEN`` set every route needs the token (401 otherwise), and
    the calls to the embedding workers send it. ``settings``: the process's, with its flags.
    """
    app = make_app("serve", client_max_size=max_request_bytes, settings=settings)
    token = auth_token_from_env(settings)
    state = ServeState(
        model, embedding_workers, max_batch=max_batch, max_inflight=max_inflight, threads=threads
    )
    state.metrics = _metrics(app)
    app[SERVE] = state
    app[STATE].set_not_ready("waiting for the embedding workers")
    app[STATE].details["model"] = str(model.path)

    async def lifecycle(app: web.Application):
        state.http = HttpClient(auth_token=token)
        state.client = EmbeddingWorkerClient(
            state.http, addresses=state.addresses, wait_timeout_s=wait_timeout_s
        )
        state.executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="serve-dense")
        checker = asyncio.create_task(_check_workers(app, wait_timeout_s))
        yield
        checker.cancel()
        await asyncio.gather(checker, return_exceptions=True)
        state.executor.shutdown(wait=True)
        await state.http.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/predict", predict)
    app.router.add_get("/signature", signature)
    return app
