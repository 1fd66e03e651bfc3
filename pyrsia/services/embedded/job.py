"""Embedded mode: the embedding PS and embedding worker engines inside the NN-worker process.

With ``PERSIA_EMBEDDED=1`` (``persia-launcher run --embedded`` sets it) one process runs the
whole job: the user's ``train.py`` unchanged, the data loader's ``data_loader.py`` in a thread
of the same process, and the services' engines in between, called in process::

    data_loader.py thread ── DataCtx.send_data ─▶ EmbeddedSender: id half prepared (hash stack,
        │                                         prefix, dedup) on this thread, buffered in the
        │                                         Worker's forward buffer; dense half queued
        ▼
    runtime loop thread ── Prefetcher, BackwardEngine ─▶ EmbeddingClient (lookup, gradients)
                           ─▶ InProcessTransport ─▶ Worker ─▶ LocalPS ─▶ EmbeddingStore
    training thread ────── forward, backward, dense step (train.py)

No HTTP, no msgpack and no Redis: the prefetcher, the gradient sender and their in-flight
bounds (the embedding staleness among them) are the services mode's own, so the embedding
gradients are applied asynchronously with the same bounded staleness. The engines live as
long as the process (:func:`get_embedded_job`): a context entered after another one sees the
same embeddings, as it would see the same PS. A checkpoint is the PS's format written as
replica 0 of 1, so it loads in services mode with any number of PS replicas, and one written
in services mode loads here.

The data loader runs in a thread when ``$PERSIA_DATALOADER_ENTRY`` names it (the launcher sets
it); it starts with the first context and its ``DataCtx`` waits until the training loop's
``StreamingDataset`` opens the batch queue. An error in it ends the training loop's stream
with that error.

The engine threads (the runtime's loop thread while a context is open, and the data loader's
thread) run in the ``background`` CPU class (Linux's ``SCHED_IDLE``) unless
``$PERSIA_CPU_PRIORITY=normal``: a dense step splits each torch operator over every core and
waits for its slowest thread, so an engine thread that preempts a training thread stalls the
whole step, while in the idle class it takes a core only when the training threads leave one
(waiting for the next batch, a finished OpenMP region). The staleness bound caps how far the
engines may fall behind; docs/guides/scaling.md has the measurements.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
from pathlib import Path

from pyrsia.services.embedded.client import EmbeddedClient
from pyrsia.services.nn_worker.ingress import BatchQueue
from pyrsia.services.nn_worker.session import Session
from pyrsia.shared.config import (
    default_global_config,
    load_embedding_config,
    load_global_config,
)
from pyrsia.shared.constants import (
    DATA_SEND_TIMEOUT_S,
    DEFAULT_WAIT_TIMEOUT_S,
    ENV_CPU_PRIORITY,
    ENV_DATALOADER_ENTRY,
    ENV_EMBEDDED,
    ENV_EMBEDDING_CONFIG,
    ENV_GLOBAL_CONFIG,
)
from pyrsia.shared.cpu_priority import apply_thread_cpu_priority, resolve_cpu_priority
from pyrsia.shared.errors import ConfigError, InvalidInputError, RegistryError
from pyrsia.shared.runtime import CpuClassHold, Runtime, get_runtime, shutdown_runtime
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)


class EmbeddedJob:
    """The process's engines, its batch queue (while a training loop streams) and the data
    loader's thread."""

    def __init__(
        self,
        client: EmbeddedClient,
        *,
        loader_script: Path | None = None,
        cpu_priority: str = "background",
        settings: Settings | None = None,
    ):
        """``settings``: the process's, which the job was built from (None: no variable
        set); its sessions and the data loader thread's sender use them."""
        self.client = client
        self.settings = Settings() if settings is None else settings
        self.loader_script = loader_script
        self.cpu_priority = cpu_priority
        """The CPU class of the engine threads (``normal`` or ``background``)."""
        self._queue: BatchQueue | None = None
        self._queue_set = threading.Condition()
        self._loader: threading.Thread | None = None
        self.loader_error: BaseException | None = None

    @classmethod
    def from_env(cls, settings: Settings) -> EmbeddedJob:
        """Engines built from ``$PERSIA_EMBEDDING_CONFIG`` and ``$PERSIA_GLOBAL_CONFIG`` (the
        files the services read), the data loader from ``$PERSIA_DATALOADER_ENTRY``; each of
        ``settings`` (the process's, from the context that opens the first session)."""
        emb = settings.text(ENV_EMBEDDING_CONFIG).strip()
        if not emb:
            raise ConfigError(
                f"${ENV_EMBEDDED}=1 needs ${ENV_EMBEDDING_CONFIG}: the embedding_config.yml the "
                "in-process embedding worker serves (persia-launcher run --embedded sets it)"
            )
        schema = load_embedding_config(emb, settings=settings)
        glob = settings.text(ENV_GLOBAL_CONFIG).strip()
        config = load_global_config(glob, settings=settings) if glob else default_global_config()
        script = settings.text(ENV_DATALOADER_ENTRY).strip()
        if script and not Path(script).is_file():
            raise ConfigError(f"${ENV_DATALOADER_ENTRY}={script!r}: no such file")
        priority = resolve_cpu_priority(None, settings, default="background")
        log.info(
            "embedded mode: embedding PS and worker engines in this process%s; engine threads "
            "at %s CPU priority ($%s)",
            f", data loader {script} in a thread" if script else "",
            priority,
            ENV_CPU_PRIORITY,
        )
        return cls(
            EmbeddedClient(schema, config),
            loader_script=Path(script) if script else None,
            cpu_priority=priority,
            settings=settings,
        )

    # --- the batch queue ---------------------------------------------------------------
    def attach_queue(self, queue: BatchQueue, runtime: Runtime) -> None:
        """The training loop's queue, where the data loader's batches go from now on."""
        with self._queue_set:
            self._queue = queue
            self._queue_set.notify_all()
        if self.loader_error is not None:
            runtime.run(queue.fail(self.loader_error))

    def detach_queue(self, queue: BatchQueue) -> None:
        with self._queue_set:
            if self._queue is queue:
                self._queue = None

    def wait_queue(self, timeout_s: float) -> BatchQueue:
        """The training loop's batch queue, once its ``StreamingDataset`` opened it."""
        with self._queue_set:
            if not self._queue_set.wait_for(lambda: self._queue is not None, timeout_s):
                raise RegistryError(
                    f"embedded mode: no training loop took batches within {timeout_s:.0f}s (a "
                    "DataLoader over a StreamingDataset in train.py opens the queue the data "
                    "loader sends to; DataCtx in embedded mode sends to the training loop of "
                    "its own process)"
                )
            assert self._queue is not None
            return self._queue

    # --- the data loader ---------------------------------------------------------------
    def start_loader(self, runtime: Runtime) -> None:
        """Run the data loader script in a daemon thread (once)."""
        if self.loader_script is None or self._loader is not None:
            return
        self._loader = threading.Thread(
            target=self._run_loader, args=(runtime,), name="pyrsia-data-loader", daemon=True
        )
        self._loader.start()

    def _run_loader(self, runtime: Runtime) -> None:
        script = self.loader_script
        assert script is not None
        try:
            apply_thread_cpu_priority(self.cpu_priority)
            run_script(script)
        except BaseException as exc:  # the training loop's stream ends with it
            log.error("embedded data loader %s failed: %r", script, exc)
            self.loader_error = exc
            with self._queue_set:
                queue = self._queue
            if queue is not None and runtime.running:
                runtime.run(queue.fail(exc))
        else:
            log.info("embedded data loader %s finished", script)

    def join_loader(self, timeout_s: float | None = None) -> None:
        if self._loader is not None:
            self._loader.join(timeout_s)

    def close(self) -> None:
        self.client.close()


def run_script(path: Path) -> None:
    """Execute a script as ``__main__`` code in its own namespace, on this thread.

    Not ``runpy.run_path``: that swaps ``sys.modules['__main__']`` (train.py's) for as long
    as the script runs. The script's folder goes on ``sys.path`` as ``python script.py``
    would put it (``from data import ...`` beside the script).
    """
    path = path.resolve()
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(1, folder)
    code = compile(path.read_bytes(), str(path), "exec")
    namespace = {"__name__": "__main__", "__file__": str(path), "__builtins__": __builtins__}
    exec(code, namespace)  # noqa: S102 - the user's own data_loader.py, as python would run it


_job: EmbeddedJob | None = None
_job_lock = threading.Lock()


def get_embedded_job(settings: Settings) -> EmbeddedJob:
    """This process's embedded job, built on first use (from ``settings``) and closed at exit."""
    global _job
    with _job_lock:
        if _job is None:
            _job = EmbeddedJob.from_env(settings)
            atexit.register(_close_at_exit, _job)
        return _job


def _close_at_exit(job: EmbeddedJob) -> None:
    """The runtime first (its lookups and gradient sends use the engines), then the engines
    (atexit runs this before the runtime's own hook, registered earlier)."""
    shutdown_runtime()
    job.close()


def reset_embedded_job() -> None:
    """Close this process's embedded job (tests: the next one starts empty)."""
    global _job
    with _job_lock:
        job, _job = _job, None
    if job is not None:
        job.close()


class EmbeddedSession(Session):
    """A :class:`Session` whose client is the in-process engines and whose ingress is a
    queue the in-process data loader fills (no server, no registry)."""

    def __init__(self, runtime: Runtime, job: EmbeddedJob):
        super().__init__(runtime, job.client, None, None, job.settings)
        self.job = job
        self._queue: BatchQueue | None = None
        self.cpu_priority = job.cpu_priority
        self._class_hold: CpuClassHold | None = None  # the loop thread's class, open to close

    @classmethod
    def open(  # type: ignore[override]
        cls,
        environment: Settings,
        *,
        addresses: list[str] | None = None,
        wait_timeout_s: float = DEFAULT_WAIT_TIMEOUT_S,
    ) -> EmbeddedSession:
        runtime = get_runtime(environment)
        job = get_embedded_job(environment)
        job.start_loader(runtime)
        session = cls(runtime, job)
        session._class_hold = runtime.hold_cpu_class(job.cpu_priority)
        return session

    def ingress(
        self, *, rank: int, world_size: int, capacity: int, reproducible: bool
    ) -> BatchQueue:  # type: ignore[override]
        """This rank's batch queue, filled by the data loader of this process."""
        if self._queue is not None:
            queue = self._queue
            if queue.capacity != capacity or queue.reproducible != reproducible:
                raise InvalidInputError(
                    "buffer_size/reproducible",
                    "one StreamingDataset configuration per context",
                    message=f"this rank's batch queue already runs with buffer_size={queue.capacity}, "
                    f"reproducible={queue.reproducible}; one StreamingDataset configuration "
                    "per training context",
                )
            return queue
        if world_size != 1:
            raise ConfigError(
                f"embedded mode runs one NN-worker rank, not {world_size}: unset "
                f"${ENV_EMBEDDED} to train on several ranks (services mode)"
            )
        queue = BatchQueue(
            capacity,
            rank=rank,
            world_size=world_size,
            reproducible=reproducible,
            skip=self.resume_skip,
            room_wait_s=DATA_SEND_TIMEOUT_S,
        )
        self._queue = queue
        self.job.attach_queue(queue, self.runtime)
        return queue

    def close(self, *, final_scrape: bool = False) -> None:
        """Detach the queue and give back the loop's CPU class (no server: no scrape to
        wait for)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            self.job.detach_queue(queue)
        if self._class_hold is not None:
            self._class_hold.release()
