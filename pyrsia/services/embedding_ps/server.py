"""The embedding parameter server's HTTP routes around an ``EmbeddingStore``.

Routes (POST, msgpack bodies, each checked once by its ``pyrsia.shared.wire`` dataclass;
PROTOCOL.md):

=====================  ===================================================  ==========================
route                  body                                                 answer
=====================  ===================================================  ==========================
/configure             {"hyperparams": {emb_initialization, admit_...}}     {"hyperparams": {...}}
/register_optimizer    {"optimizer": {"type": "adagrad", "lr": ...}}         {"optimizer": {...}}
/lookup                {"train": bool, "groups": [{"dim", "ids"}],          {"groups": [float32 (n, dim)],
                        "updates": [/update bodies] = []}                     "applied": [/update answers]}
/update                {"groups": [{"dim", "ids", "grads"}]}                {"applied", "skipped_..."}
/dump, /load           {"dir": str} (inside the PS checkpoint roots)          manifest / {"entries"}
/clear, /stats         {} / none                                            stats
/checksum              {} / none                                            {"entries", "checksum"}
=====================  ===================================================  ==========================

A Train PS draws a random ``boot_id`` per process start and says whether it ``loaded`` a
checkpoint since (``/health``, and the answers of /configure, /register_optimizer, /load, /clear
and /stats): the embedding worker tells a replica restarted empty from the process it trained
on by them (``embedding_worker/ps_boots.py``).

An Infer PS (``job_type: Infer``) serves reads only: ``/update``, ``/clear``,
``/register_optimizer`` and train ``/lookup`` answer 409 naming its role (``INFER_READ_ONLY``).

Lookups and updates run in a thread pool (the compiled kernels release the GIL),
so ``/health`` answers while a large batch is being processed.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from pyrsia.services.embedding_ps.checkpoint_io import checkpoint_io
from pyrsia.services.embedding_ps.checkpoint_root import confine
from pyrsia.services.embedding_ps.checksum import store_checksum
from pyrsia.services.embedding_ps.engine import EmbeddingStore
from pyrsia.services.embedding_ps.incremental import IncrementalLoader
from pyrsia.services.embedding_ps.persia_metrics import PSPersiaMetrics
from pyrsia.services.embedding_ps.ps_metrics import loader_gauges, request_metrics
from pyrsia.shared.constants import PS_INCREMENTAL_SCAN_INTERVAL_S
from pyrsia.shared.embedding_spec import optimizer_to_dict
from pyrsia.shared.errors import ConflictError
from pyrsia.shared.http_server import METRICS, STATE, make_app, msgpack_handler, require_ready
from pyrsia.shared.persia_compat import persia_labels
from pyrsia.shared.settings import Settings
from pyrsia.shared.thread_offload import Offloader
from pyrsia.shared.wire.admin import Configure, Directory, Empty, RegisterOptimizer
from pyrsia.shared.wire.ps import (
    IdGroup,
    PSLookup,
    PSLookupAnswer,
    PSStats,
    PSUpdate,
    UpdateTotals,
)

log = logging.getLogger(__name__)

STORE = web.AppKey("ps_store", EmbeddingStore)
OFFLOAD = web.AppKey("ps_offload", Offloader)
PS_METRICS = web.AppKey("ps_metrics", dict)
PERSIA_METRICS = web.AppKey("ps_persia_metrics", PSPersiaMetrics)
LOADER = web.AppKey("ps_incremental_loader", IncrementalLoader)
CHECKPOINT_WORKERS = web.AppKey("ps_checkpoint_workers", int)
CHECKPOINT_ROOT = web.AppKey("ps_checkpoint_root", tuple)  # the roots (checkpoint_root.py)


class _Status:
    """Why the PS is not ready yet: it needs hyperparameters and an optimizer."""

    def __init__(self) -> None:
        self.configured = False
        self.infer = False  # an Infer replica serves eval lookups: it needs no optimizer

    def refresh(self, app: web.Application) -> None:
        store = app[STORE]
        missing = []
        if not self.configured:
            missing.append("not configured (POST /configure)")
        if store.optimizer is None and not self.infer:
            missing.append("no optimizer registered (POST /register_optimizer)")
        if missing:
            app[STATE].set_not_ready("; ".join(missing))
        else:
            app[STATE].set_ready()


STATUS = web.AppKey("ps_status", _Status)

INFER_READ_ONLY = {
    "/update": "it applies no gradients; send them to the PS replicas of a Train job",
    "/clear": "clearing would drop every entry it serves",
    "/register_optimizer": "registering one would rewrite its entries' optimizer state",
    "/lookup": "a train lookup would insert (and evict) entries; send train=False",
}
"""Routes an Infer PS refuses, and why. It keeps what serves: eval lookups, /load of its served
checkpoint, incremental packets (applied by its loader, not over HTTP), /dump, /stats,
/checksum, and /configure (its settings are used only by train lookups and updates, both
refused here, so it changes nothing served; an InferCtx built with an embedding_config sends
it)."""


def _refuse_on_infer(request: web.Request, route: str) -> None:
    """409 naming the role when an Infer PS is asked to change what it serves. 409 and not 403:
    the refusal comes from the server's mode, not from who is asking."""
    if request.app[STATUS].infer:
        raise ConflictError(
            f"{route} refused (409 Conflict): this PS runs job_type Infer, a read-only replica "
            f"serving a loaded checkpoint; {INFER_READ_ONLY[route]}. 409 and not 403: the refusal "
            "comes from the server's mode, not from who is asking (no token or permission would "
            "change it)."
        )


def _with_boot(request: web.Request, answer: dict) -> dict:
    """``answer`` plus this process's ``boot_id`` and whether it loaded a checkpoint (a Train
    PS; ``ps_boots.py`` in the worker tells a replica restarted empty from the process it
    trained on, or from a restarted one a resume loaded)."""
    details = request.app[STATE].details
    if "boot_id" not in details:
        return answer
    return {**answer, "boot_id": details["boot_id"], "loaded": details["loaded"]}


async def _in_thread(request: web.Request, fn, *args):
    """Unbounded work (dumps, loads, clears, checksums): always in the thread pool."""
    return await request.app[OFFLOAD].run(None, fn, *args)


@msgpack_handler
async def configure(request: web.Request, body: Any) -> dict:
    """Set initialization bounds, admission probability and weight bound."""
    params = Configure.from_wire(body).hyperparams
    request.app[STORE].configure(params)
    request.app[STATUS].configured = True
    request.app[STATUS].refresh(request.app)
    log.info("configured: %s", params)
    return _with_boot(request, {"hyperparams": params.to_dict()})


@msgpack_handler
async def register_optimizer(request: web.Request, body: Any) -> dict:
    """Register the embedding optimizer (same one again is a no-op; another one needs /clear)."""
    _refuse_on_infer(request, "/register_optimizer")
    spec = RegisterOptimizer.from_wire(body).optimizer
    request.app[STORE].register_optimizer(spec)
    request.app[STATUS].refresh(request.app)
    log.info("optimizer registered: %s", spec)
    return _with_boot(request, {"optimizer": optimizer_to_dict(spec)})


@msgpack_handler
async def lookup(request: web.Request, body: Any) -> dict:
    """Embeddings of every id of every dim group; train lookups may insert and evict.
    Carried updates (``updates``) are applied first, in order, as ``/update`` applies them.

    An eval lookup needs only the hyperparameters (/configure), not an optimizer: it never
    inserts, so no optimizer state is made, and PERSIA's PS served it the same way."""
    msg = PSLookup.from_wire(body)
    train = msg.train
    if msg.updates:
        _refuse_on_infer(request, "/update")
    if train:
        _refuse_on_infer(request, "/lookup")
    if train or msg.updates or not request.app[STATUS].configured:
        require_ready(request)
    store, metrics = request.app[STORE], request.app[PS_METRICS]
    before = store.lookup_counters() if train else None  # PERSIA's index_miss_ratio
    started = time.perf_counter()

    def work() -> tuple[tuple[UpdateTotals, ...], tuple[np.ndarray, ...]]:
        applied = tuple(_apply(store, u.groups) for u in msg.updates)
        return applied, tuple(store.lookup(g.ids, g.dim, train=train) for g in msg.groups)

    n_updates = sum(len(g.ids) for u in msg.updates for g in u.groups)
    n = sum(len(g.ids) for g in msg.groups)
    applied, out = await request.app[OFFLOAD].run(n + n_updates, work)
    if msg.updates:
        _count_updates(request, n_updates, sum(applied, UpdateTotals()))
    ids, latency = metrics["lookup_train" if train else "lookup_eval"]
    ids.inc(n)
    seconds = time.perf_counter() - started
    latency.observe(seconds)
    request.app[PERSIA_METRICS].looked_up(before, seconds)
    return PSLookupAnswer(out, applied).to_wire()


@msgpack_handler
async def update(request: web.Request, body: Any) -> dict:
    """Apply per-id gradients with the registered optimizer (an Infer replica refuses: 409)."""
    _refuse_on_infer(request, "/update")
    require_ready(request)
    groups = PSUpdate.from_wire(body).groups
    store = request.app[STORE]
    started = time.perf_counter()
    n = sum(len(g.ids) for g in groups)
    total = await request.app[OFFLOAD].run(n, _apply, store, groups)
    _count_updates(request, n, total)
    _, latency = request.app[PS_METRICS]["update"]
    latency.observe(time.perf_counter() - started)
    return total.to_wire()


def _apply(store: EmbeddingStore, groups: tuple[IdGroup, ...]) -> UpdateTotals:
    """One update body's groups applied with the registered optimizer, in order."""
    r = store.update_groups((g.ids, g.grads) for g in groups)
    return UpdateTotals(r.applied, r.skipped_unknown, r.skipped_nonfinite)


def _count_updates(request: web.Request, n: int, total: UpdateTotals) -> None:
    """The update metrics of ``n`` gradient rows applied (by ``/update``, or carried on a
    ``/lookup``: the ``update`` request latency counts ``/update`` requests only)."""
    ids, _ = request.app[PS_METRICS]["update"]
    ids.inc(n)
    request.app[PERSIA_METRICS].gradient_id_misses += total.skipped_unknown


@msgpack_handler
async def dump(request: web.Request, body: Any) -> dict:
    """Write this replica's shard of a checkpoint into ``dir``."""
    directory = confine(Directory.from_wire(body).dir, request.app.get(CHECKPOINT_ROOT))
    state = request.app[STATE].details
    manifest = await _in_thread(
        request,
        checkpoint_io,
        request.app[STORE].dump,
        directory,
        state["replica_index"],
        state["replica_size"],
        request.app[CHECKPOINT_WORKERS],
    )
    return {"manifest": manifest}


@msgpack_handler
async def load(request: web.Request, body: Any) -> dict:
    """Load the ids routed to this replica from a checkpoint written by any number of replicas."""
    directory = confine(Directory.from_wire(body).dir, request.app.get(CHECKPOINT_ROOT))
    state = request.app[STATE].details
    started = time.perf_counter()
    entries = await _in_thread(
        request,
        checkpoint_io,
        request.app[STORE].load,
        directory,
        state["replica_index"],
        state["replica_size"],
        request.app[CHECKPOINT_WORKERS],
    )
    request.app[PERSIA_METRICS].set_embedding_s = time.perf_counter() - started
    request.app[STATUS].configured = True  # a loaded checkpoint is enough to serve lookups
    request.app[STATE].details["loaded"] = True
    request.app[STATUS].refresh(request.app)
    return _with_boot(request, {"entries": entries})


@msgpack_handler
async def clear(request: web.Request, body: Any) -> dict:
    """Drop every entry (the optimizer and hyperparameters stay); an Infer PS refuses (409)."""
    _refuse_on_infer(request, "/clear")
    Empty.from_wire(body)
    await _in_thread(request, request.app[STORE].clear)
    return _with_boot(request, dict(request.app[STORE].stats()))


@msgpack_handler
async def stats(request: web.Request, body: Any) -> dict:
    """Entries, evictions, admission refusals, skipped updates, memory."""
    Empty.from_wire(body)
    store = request.app[STORE]
    out = dict(store.stats())
    out["optimizer"] = optimizer_to_dict(store.optimizer) if store.optimizer else None
    out["hyperparams"] = store.hyperparams.to_dict()
    loader = request.app.get(LOADER)
    if loader is not None:
        out["incremental"] = loader.stats.to_dict()
    return _with_boot(request, PSStats(out["entries"], out["updates_applied"], out).to_wire())


@msgpack_handler
async def checksum(request: web.Request, body: Any) -> dict:
    """``{"entries", "checksum"}``: a hash of every stored id and row (pyrsia/services/embedding_ps/checksum.py)."""
    Empty.from_wire(body)
    return await _in_thread(request, store_checksum, request.app[STORE])


def create_app(
    store: EmbeddingStore,
    *,
    replica_index: int = 0,
    replica_size: int = 1,
    threads: int = 2,
    ready_without_configure: bool = False,
    incremental_loader: IncrementalLoader | None = None,
    scan_interval_s: float = PS_INCREMENTAL_SCAN_INTERVAL_S,
    max_request_bytes: int | None = None,
    checkpoint_workers: int = 1,
    checkpoint_root: tuple[Path, ...] | Path | None = None,
    settings: Settings,
) -> web.Application:
    """The PS app for one replica. ``ready_without_configure``: an Infer replica (serves eval
    lookups without /configure or an optimizer); ``incremental_loader`` scans for packets;
    ``max_request_bytes`` caps request bodies (413 beyond); ``checkpoint_workers`` threads
    write and read /dump and /load files (``checkpointing_config.num_workers``); with
    ``checkpoint_root`` (one root or several) those paths must lie in one
    (``checkpoint_root.py``; the launcher always passes the roots, None is for in-process apps).
    ``settings``: the process's, with its flags over them (body and connection limits, token)."""
    app = make_app(
        f"embedding_parameter_server/{replica_index}",
        client_max_size=max_request_bytes,
        settings=settings,
    )
    app[STORE] = store
    app[CHECKPOINT_WORKERS] = checkpoint_workers
    if checkpoint_root is not None:
        roots = (checkpoint_root,) if isinstance(checkpoint_root, Path) else tuple(checkpoint_root)
        app[CHECKPOINT_ROOT] = roots
    app[STATUS] = _Status()
    app[STATUS].configured = ready_without_configure
    app[STATUS].infer = ready_without_configure
    app[STATE].details.update(replica_index=replica_index, replica_size=replica_size)
    if not ready_without_configure:  # a Train PS: a random id for this process (ps_boots.py)
        app[STATE].details.update(boot_id=secrets.token_hex(8), loaded=False)
    app[PS_METRICS] = request_metrics(app[METRICS], store)
    app[PERSIA_METRICS] = PSPersiaMetrics(store, lambda: persia_labels(app[STATE]))
    app[METRICS].register(app[PERSIA_METRICS])

    async def executor_ctx(app: web.Application):
        app[OFFLOAD] = Offloader(ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ps"))
        yield
        # queued work whose request is gone is dropped; the running kernel finishes
        app[OFFLOAD].shutdown()
        _close_store(store)

    app.cleanup_ctx.append(executor_ctx)
    if incremental_loader is not None:  # after the executor: its scanner runs there
        _add_loader(app, incremental_loader, scan_interval_s)
    app[STATUS].refresh(app)
    _add_routes(app)
    return app


def _add_loader(app: web.Application, loader: IncrementalLoader, interval_s: float) -> None:
    """Keep an Infer replica's incremental ``loader`` on ``app`` (``/stats``), export its
    counts as gauges, and scan for packets every ``interval_s`` while the app runs."""
    app[LOADER] = loader
    loader_gauges(app[METRICS], loader.stats)

    async def scanner_ctx(app: web.Application):
        scanner = asyncio.create_task(loader.scan_forever(app[OFFLOAD], interval_s))
        yield
        scanner.cancel()
        await asyncio.gather(scanner, return_exceptions=True)

    app.cleanup_ctx.append(scanner_ctx)


def _close_store(store: EmbeddingStore) -> None:
    """At shutdown, once no request runs: log the final counts, write the last partial
    incremental packet (so it is not lost) and stop the store's shard threads."""
    final = store.stats()
    log.info(
        "final stats: updates_applied=%d entries=%d",
        final["updates_applied"],
        final["entries"],
    )
    if store.incremental is not None:
        store.incremental.flush(store)  # the last partial packet is not lost on shutdown
    store.close()


def _add_routes(app: web.Application) -> None:
    """The PS routes (module docstring): every one on POST, /stats and /checksum on GET too."""
    for path, handler in [
        ("/configure", configure),
        ("/register_optimizer", register_optimizer),
        ("/lookup", lookup),
        ("/update", update),
        ("/dump", dump),
        ("/load", load),
        ("/clear", clear),
        ("/stats", stats),
        ("/checksum", checksum),
    ]:
        app.router.add_post(path, handler)
    app.router.add_get("/stats", stats)
    app.router.add_get("/checksum", checksum)
