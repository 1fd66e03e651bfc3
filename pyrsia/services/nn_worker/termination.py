"""SIGTERM inside ``TrainCtx``: stop training, drain in-flight gradients, exit 0 quickly.

Under honcho, docker compose or Kubernetes a stop is SIGTERM, then SIGKILL a few seconds
later. Python's default for SIGTERM kills the rank on the spot, dropping the embedding
gradients still on the wire (up to the staleness window). While a ``TrainCtx`` is
entered in the main thread, SIGTERM instead raises ``SystemExit(0)`` in the training
loop; leaving the ``with`` block sends and waits for every in-flight gradient
(``TrainCtx.__exit__``), and the process then exits 0 without interpreter finalization
(seconds with torch loaded), so the whole stop fits in the supervisor's grace period.

Should the exit path get stuck all the same, a watchdog started with the signal ends the
rank ``SIGTERM_DEADLINE_S`` after it, with every thread's stack on stderr and exit code 1
(the drain did not finish). Without it a stuck rank outlived the SIGKILL its supervisor
sends to torch's launcher, and kept the job's output pipe, so honcho never finished.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import signal
import threading
import time

from pyrsia.shared.constants import SIGNAL_NOTE_WAIT_S, SIGTERM_DEADLINE_S, SIGTERM_DRAIN_S

__all__ = ["SIGTERM_DRAIN_S", "TerminationGuard"]

log = logging.getLogger(__name__)


class TerminationGuard:
    """Installs the SIGTERM handler for the time a training context is entered."""

    def __init__(self) -> None:
        self._previous = None
        self._installed = False

    @property
    def triggered(self) -> bool:
        """True once SIGTERM arrived (the context then drains within ``SIGTERM_DRAIN_S``)."""
        return _STATE["triggered"]

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._previous = signal.signal(signal.SIGTERM, _on_sigterm)
        self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


_STATE: dict = {"triggered": False, "at": 0.0, "watchdog": False, "notes": []}


def _on_sigterm(signum: int, frame: object) -> None:
    _STATE["triggered"] = True
    _STATE["at"] = time.monotonic()
    if not _STATE["watchdog"]:  # first: nothing below may keep it from starting
        _STATE["watchdog"] = True
        watchdog = threading.Timer(SIGTERM_DEADLINE_S, _exit_overdue)
        watchdog.daemon = True
        watchdog.name = "pyrsia-sigterm-watchdog"
        watchdog.start()
    atexit.register(_exit_fast)  # registered last, so it runs first at exit
    _note("SIGTERM: stopping training; draining in-flight embedding gradients, then exit 0")
    raise SystemExit(0)


def _note(message: str, level: int = logging.WARNING) -> threading.Thread:
    """Log ``message`` from a thread of its own, never from a signal handler's frame.

    The signal may have landed in the middle of a log line in this very thread, whose stream
    lock that write holds: logging here would wait for it forever (the rank then hung with
    the job's output pipe, and honcho never ended). The thread writes once the interrupted
    write lets go.
    """
    thread = threading.Thread(
        target=log.log, args=(level, message), name="pyrsia-signal-note", daemon=True
    )
    thread.start()
    _STATE["notes"].append(thread)
    return thread


def _exit_overdue() -> None:
    """The rank is still here ``SIGTERM_DEADLINE_S`` after SIGTERM: say where, and leave.

    What stuck it may hold a logging lock for good, so the line goes through a thread and,
    if that cannot write in time, straight to the stderr file descriptor; the exit then
    skips the flushes that could wait on the same locks."""
    message = (
        f"SIGTERM: the rank has not stopped {time.monotonic() - _STATE['at']:.1f}s after the "
        "signal; every thread's stack follows, then exit 1 (in-flight embedding gradients "
        "may be lost)"
    )
    note = _note(message, logging.ERROR)
    note.join(SIGNAL_NOTE_WAIT_S)
    if note.is_alive():
        try:
            os.write(2, f"{message}\n".encode())
        except OSError:  # stderr closed
            pass
    try:
        faulthandler.dump_traceback(all_threads=True)
    except (OSError, ValueError, RuntimeError):  # stderr closed
        pass
    if note.is_alive():
        os._exit(1)
    from pyrsia.shared.process_exit import exit_now

    exit_now(1)


def _exit_fast() -> None:
    from pyrsia.shared.process_exit import exit_now

    for note in _STATE["notes"]:  # the signal's note first, in its order
        note.join(SIGNAL_NOTE_WAIT_S)
    log.warning(
        "SIGTERM: training stopped, exit 0 %.2fs after the signal", time.monotonic() - _STATE["at"]
    )
    exit_now(0)
