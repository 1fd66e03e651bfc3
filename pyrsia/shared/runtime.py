"""A process's background event loop: one asyncio (uvloop) loop per process.

The NN worker's ranks, the data loader's sender and embedded mode share it. ``train.py``
is ordinary synchronous PyTorch code, while everything that talks to
the other services (embedding lookups, gradient sends, the batch ingress) is
asyncio. ``Runtime`` runs one event loop in a background thread and owns the
process's single :class:`~pyrsia.shared.http_client.HttpClient`; synchronous code hands
it coroutines:

- ``run(coro)`` blocks until the coroutine is done and returns its result (or raises
  its exception in the caller's thread);
- ``submit(coro)`` returns a ``concurrent.futures.Future`` at once.

The loop starts lazily on first use (:func:`get_runtime`) and stops at interpreter
exit: tasks still running are cancelled and awaited, the HTTP session is closed,
the thread is joined. Nothing is fired and forgotten.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from pyrsia.shared.auth import auth_token_from_env
from pyrsia.shared.constants import (
    GIL_SWITCH_INTERVAL_S,
    PYTHON_DEFAULT_SWITCH_INTERVAL_S,
    RUNTIME_STOP_TIMEOUT_S,
)
from pyrsia.shared.cpu_priority import apply_thread_cpu_priority
from pyrsia.shared.errors import MisuseError, RuntimeClosedError
from pyrsia.shared.http_client import HttpClient
from pyrsia.shared.serial_ops import run_torch_ops_serially_on_this_thread
from pyrsia.shared.settings import Settings

log = logging.getLogger(__name__)

T = TypeVar("T")


def shorten_gil_switch_interval() -> None:
    """Give the process a 0.5 ms GIL switch interval unless it chose its own.

    With the loop thread decoding answers and encoding gradients in Python, the training
    thread otherwise waits up to Python's default 5 ms for the GIL after each torch call
    that released it; a script that set its own interval keeps it.
    """
    if sys.getswitchinterval() == PYTHON_DEFAULT_SWITCH_INTERVAL_S:
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


class CpuClassHold:
    """One holder of the loop thread's CPU class (:meth:`Runtime.hold_cpu_class`)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime: Runtime | None = runtime

    def release(self) -> None:
        """Give the hold back (once, however often called)."""
        runtime, self._runtime = self._runtime, None
        if runtime is not None:
            runtime._release_cpu_class()


class Runtime:
    """An event loop in a daemon thread plus the process's HTTP client."""

    def __init__(self, auth_token: str | None = None) -> None:
        """``auth_token``: the job's ``PERSIA_AUTH_TOKEN``, sent by :attr:`client`."""
        self._auth_token = auth_token
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._client: HttpClient | None = None
        self._class_holders = 0
        self._class_priority = "normal"  # what the first holder asked for
        self._loop_waiters = 0  # threads blocked on the loop (they lend it the default class)
        self._class_applied = "normal"
        self._class_lock = threading.Lock()

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> Runtime:
        """Start the loop thread (idempotent); returns once the loop exists, also in a thread
        that calls while another thread's start is still bringing the loop up."""
        with self._lock:
            if self._closed:
                raise RuntimeClosedError("the NN-worker runtime has been stopped")
            if self._thread is None:
                shorten_gil_switch_interval()
                self._thread = threading.Thread(
                    target=self._main, name="pyrsia-runtime", daemon=True
                )
                self._thread.start()
        self._started.wait()
        return self

    def _main(self) -> None:
        run_torch_ops_serially_on_this_thread()  # no second OpenMP team beside training's
        try:
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a Linux dependency
            loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        self._client = HttpClient(auth_token=self._auth_token)
        self._started.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._drain())
            loop.close()

    async def _drain(self) -> None:
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
        await asyncio.sleep(0)  # let aiohttp close its transports

    def stop(self) -> None:
        """Cancel what still runs, close the HTTP session, join the thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if thread is threading.current_thread():
            raise MisuseError("Runtime.stop() cannot be called from the runtime's own thread")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(RUNTIME_STOP_TIMEOUT_S)
        if thread.is_alive():  # pragma: no cover - a coroutine ignored cancellation
            log.warning(
                "the NN-worker runtime thread did not stop within %.0fs", RUNTIME_STOP_TIMEOUT_S
            )

    # --- the loop thread's CPU class ------------------------------------------------------
    def hold_cpu_class(self, priority: str) -> CpuClassHold:
        """One more holder (a training loop, embedded mode's session) keeps the loop thread in
        ``priority``'s CPU class (``pyrsia.shared.cpu_priority``); the first one sets it.
        Give it back with the hold's ``release()``. While a thread waits on the loop
        (:meth:`waiting_on_loop`) the loop runs in the default class all the same."""
        with self._class_lock:
            self._class_holders += 1
            if self._class_holders == 1:
                self._class_priority = priority
                self._apply_class()
        return CpuClassHold(self)

    def _release_cpu_class(self) -> None:
        """One holder fewer; after the last one the loop thread is back in the default class."""
        with self._class_lock:
            self._class_holders = max(0, self._class_holders - 1)
            if self._class_holders == 0:
                self._apply_class()

    @contextlib.contextmanager
    def waiting_on_loop(self) -> Iterator[None]:
        """Bracket a block in which the calling thread waits for the loop (a batch, a send
        slot, :meth:`run`): meanwhile the loop thread runs in the default class.

        The idle class keeps the loop off the cores while the training threads compute; it
        assumes that the cores then have gaps. Other processes that keep every core busy
        (several ranks and the services on two cores, another job) leave it none, and an
        idle-class thread then waited seconds per wake-up: the registry heartbeat lapsed and
        Prometheus's scrapes timed out while the rank trained (``make compose-test``). A
        thread that waits on the loop has nothing better for the core to do."""
        with self._class_lock:
            self._loop_waiters += 1
            self._apply_class()
        try:
            yield
        finally:
            with self._class_lock:
                self._loop_waiters -= 1
                self._apply_class()

    def _apply_class(self) -> None:
        """Put the loop thread in the class its holders and waiters call for (under the lock)."""
        held = self._class_holders and not self._loop_waiters
        wanted = self._class_priority if held else "normal"
        if wanted != self._class_applied and self.running and self.native_id is not None:
            apply_thread_cpu_priority(wanted, self.native_id)
            self._class_applied = wanted

    @property
    def native_id(self) -> int | None:
        """The loop thread's OS thread id (None before it started)."""
        return None if self._thread is None else self._thread.native_id

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._closed

    # --- work -------------------------------------------------------------------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        self.start()
        assert self._loop is not None  # set before _started
        return self._loop

    @property
    def client(self) -> HttpClient:
        """The process's one pooled HTTP client (use it only from coroutines run here)."""
        self.start()
        assert self._client is not None
        return self._client

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; the returned future carries its result or error."""
        if self._closed:
            coro.close()
            raise RuntimeClosedError("the NN-worker runtime has been stopped")
        loop = self.loop
        if self._in_loop_thread():
            coro.close()
            raise MisuseError("Runtime.submit() called from the runtime thread; await instead")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and block until it finishes; its exception is re-raised.

        With ``timeout_s`` the coroutine is cancelled and ``TimeoutError`` raised when it
        takes longer. A KeyboardInterrupt while waiting cancels the coroutine too.
        """
        future = self.submit(coro)
        try:
            with self.waiting_on_loop():
                return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"operation did not finish within {timeout_s:.1f}s") from None
        except BaseException:
            future.cancel()
            raise

    def _in_loop_thread(self) -> bool:
        return self._thread is threading.current_thread()


_runtime: Runtime | None = None
_runtime_pid: int | None = None
_runtime_lock = threading.Lock()
_runtime_token: str | None = None
"""The token the last runtime was made with (``PERSIA_AUTH_TOKEN`` of its settings)."""


def get_runtime(settings: Settings | None = None) -> Runtime:
    """This process's runtime, started on first use and stopped at interpreter exit.

    The first call makes it: its HTTP client sends ``PERSIA_AUTH_TOKEN`` of ``settings`` (the
    caller's entry point's; a context opening its session passes them); later calls get the
    running one. A forked child, or a call after :func:`shutdown_runtime`, gets a fresh
    runtime (threads do not survive ``fork``), with the token of the last one unless
    ``settings`` are given.
    """
    global _runtime, _runtime_pid, _runtime_token
    with _runtime_lock:
        if _runtime is None or _runtime_pid != os.getpid() or _runtime._closed:
            if settings is not None:
                _runtime_token = auth_token_from_env(settings)
            _runtime = Runtime(_runtime_token)
            _runtime_pid = os.getpid()
            atexit.register(_runtime.stop)
        runtime = _runtime
    return runtime.start()


def shutdown_runtime() -> None:
    """Stop this process's runtime now (tests and entry points; exit does it anyway)."""
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None and _runtime_pid == os.getpid():
        runtime.stop()
