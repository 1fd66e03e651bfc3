"""One line per mistake, whichever process finds it.

A process that ends on an error says so in one line on stderr, its last::

    error: <process>: <what was wrong, and the fix> (traceback: <log file>)

and writes the full traceback to ``<log file>``, ``<process>.log`` in :func:`log_dir`
(``$PERSIA_LOG_DIR``, else ``persia-<job id>`` in the system's temporary folder). The
process is the one that found the mistake: ``embedding_parameter_server/0``,
``nn_worker/1``, ``data_loader/0``, or the script's name when it was started by hand.

Known errors (a bad config or flag, Redis unreachable, a service that never registered:
:data:`KNOWN_ERRORS`) end with code 2 and their traceback stays in the file; so does any
other :class:`~pyrsia.shared.errors.PersiaError`'s (code 1), whose message says what to do.
Any other exception comes from the user's script: its traceback (the script's frames, not
the launcher's) is printed once, then the line, which names the script's line and, for a
few mistakes torch reports in its own words, the fix (:data:`HINTS`).

Under ``persia-launcher run`` every such process also leaves a record in the job's log
folder; once the job has stopped, ``run`` reads them (:func:`first_failure`) and its last
line names the process that failed first, not the last one to die.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from pyrsia.shared.constants import ENV_LOG_DIR, ENV_PROCESS
from pyrsia.shared.errors import ConfigError, PersiaError, RegistryError
from pyrsia.shared.redaction import redact
from pyrsia.shared.settings import Settings

KNOWN_ERRORS = (ConfigError, RegistryError)
"""Errors whose message says the cause and the fix (a bad config or flag, Redis unreachable,
a service never registered): exit code 2."""
EXIT_KNOWN = 2
EXIT_FAILED = 1
RECORD_SUFFIX = ".failure.json"

_SIZE = r"\((?:torch\.Size\()?\[([^\]]*)\]\)?\)"
HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(rf"Target size {_SIZE} must be the same as input size {_SIZE}"),
        "the labels' shape [{0}] is not the model output's [{1}]: send labels of the "
        "output's shape (Label(y.reshape(-1, 1)) in data_loader.py for one score per sample)",
    ),
)
"""Torch's words for a mistake in train.py, and the fix to add to the line."""

_ROOT = Path(__file__).resolve().parents[2]
_OUR_CODE = (f"{_ROOT / 'pyrsia'}{os.sep}", f"{_ROOT / 'persia'}{os.sep}")
"""Pyrsia's own files: frames a user's traceback does not need."""


_NAME: list[str] = []
"""The name a service gave itself at start (:func:`name_this_process`)."""


def name_this_process(name: str) -> None:
    """Set once by a service's entry point: ``embedding_parameter_server/0``."""
    _NAME[:] = [name]


def process_name(settings: Settings, default: str | None = None) -> str:
    """This process's name in error lines: ``default``, else ``$PERSIA_PROCESS`` of
    ``settings`` (a launcher running a user script), else the service's own name, else the
    script's file name."""
    return (
        default
        or settings.text(ENV_PROCESS)
        or (_NAME[0] if _NAME else None)
        or Path(sys.argv[0] or "python").name
    )


def log_dir(settings: Settings) -> Path:
    """Where tracebacks and failure records go (created on first use): ``$PERSIA_LOG_DIR`` of
    ``settings``, else ``persia-<job id>`` in the system's temporary folder."""
    raw = settings.text(ENV_LOG_DIR)
    if raw:
        return Path(raw)
    job = re.sub(r"[^A-Za-z0-9_.-]", "_", settings.job_id)
    return Path(tempfile.gettempdir()) / f"persia-{job}"


def log_path(process: str, settings: Settings) -> Path:
    return log_dir(settings) / f"{process.replace('/', '-')}.log"


def _user_frame(tb: TracebackType | None) -> traceback.FrameSummary | None:
    """The innermost frame of the user's code: not Pyrsia's, not the standard library's or
    an installed package's."""
    skip = (*_OUR_CODE, sys.prefix, sys.base_prefix, sys.exec_prefix)
    frames = [
        f
        for f in traceback.extract_tb(tb)
        if not f.filename.startswith(skip) and not f.filename.startswith("<")
    ]
    return frames[-1] if frames else None


def describe(exc: BaseException) -> str:
    """What went wrong in one line: a PersiaError's message (it names the fix), else the
    exception, where the user's code raised it, and the fix when :data:`HINTS` knows it."""
    text = " ".join(str(exc).split())
    if isinstance(exc, PersiaError):
        return redact(text)
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    frame = _user_frame(exc.__traceback__)
    if frame is not None:
        line += f" at {Path(frame.filename).name}:{frame.lineno}"
    for pattern, fix in HINTS:
        match = pattern.search(text)
        if match:
            line += "; " + fix.format(*match.groups())
            break
    return redact(line)


def exit_code(exc: BaseException) -> int:
    return EXIT_KNOWN if isinstance(exc, KNOWN_ERRORS) else EXIT_FAILED


def _script_frames(exc: BaseException) -> list[str]:
    """The traceback from the user's first frame on (runpy and the launcher's frames cut)."""
    lines = traceback.format_exception(exc)
    tb = exc.__traceback__
    while tb is not None and (
        tb.tb_frame.f_code.co_filename.startswith(_OUR_CODE)
        or tb.tb_frame.f_code.co_filename.startswith("<frozen")
    ):
        tb = tb.tb_next
    if tb is None or exc.__cause__ is not None or exc.__context__ is not None:
        return lines
    return traceback.format_exception(type(exc), exc, tb)


def report(
    exc: BaseException,
    settings: Settings,
    process: str | None = None,
    *,
    show_traceback: bool = False,
    user_script: bool = True,
) -> int:
    """End-of-process report of ``exc``: traceback to the log file, a failure record when
    under ``persia-launcher run``, the traceback on stderr when it is not a PersiaError (or
    ``show_traceback``), then one line; returns the exit code (2 known, else 1).
    ``user_script``: the traceback shown starts at the script's first frame (False: a
    service's own crash, shown whole). ``settings``: the process's, from its entry point."""
    process = process_name(settings, process)
    code = exit_code(exc)
    message = describe(exc)
    full = "".join(traceback.format_exception(exc))
    path: Path | None = log_path(process, settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {process} exited {code}\n")
            f.write(redact(full))
    except OSError:
        path = None
    _write_record(settings, process, message, code, path, getattr(exc, _SEEN_AT, None))
    if show_traceback or not isinstance(exc, PersiaError):
        shown = _script_frames(exc) if user_script else traceback.format_exception(exc)
        sys.stderr.write(redact("".join(shown)))
    where = f" (traceback: {path})" if path is not None else ""
    print(f"error: {process}: {message}{where}", file=sys.stderr, flush=True)
    return code


@dataclass(frozen=True)
class FailureRecord:
    """One process's end on an error, as ``run`` reads it back."""

    time: float
    process: str
    message: str
    code: int
    log: str | None

    def line(self) -> str:
        where = f" (traceback: {self.log})" if self.log else ""
        return f"error: {self.process} failed first: {self.message}{where}"


_SEEN_AT = "_pyrsia_failed_at"


def note_failure(exc: BaseException | None, settings: Settings) -> None:
    """Record ``exc`` as this process's failure the moment it leaves a context's ``with``
    block, before the context's clean-up closes the servers that peers would otherwise find
    gone first (and report as the first failure); :func:`report` keeps this time."""
    if exc is None or not isinstance(exc, Exception) or hasattr(exc, _SEEN_AT):
        return
    try:
        setattr(exc, _SEEN_AT, time.time())
    except AttributeError:
        return
    process = process_name(settings)
    path = log_path(process, settings)
    _write_record(settings, process, describe(exc), exit_code(exc), path, getattr(exc, _SEEN_AT))


def _write_record(
    settings: Settings,
    process: str,
    message: str,
    code: int,
    path: Path | None,
    seen_at: float | None = None,
) -> None:
    """Under ``persia-launcher run`` (``$PERSIA_LOG_DIR`` set): the record, written whole."""
    folder = settings.text(ENV_LOG_DIR)
    if not folder:
        return
    record = {
        "time": seen_at or time.time(),
        "process": process,
        "message": message,
        "code": code,
        "log": str(path) if path is not None else None,
    }
    target = Path(folder) / f"{process.replace('/', '-')}{RECORD_SUFFIX}"
    try:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        tmp.replace(target)
    except OSError:
        pass


def first_failure(folder: Path) -> FailureRecord | None:
    """The earliest failure record in ``folder`` (None: no process reported one)."""
    records = []
    for path in folder.glob(f"*{RECORD_SUFFIX}"):
        try:
            raw = json.loads(path.read_text())
            records.append(
                FailureRecord(
                    float(raw["time"]),
                    str(raw["process"]),
                    str(raw["message"]),
                    int(raw["code"]),
                    raw.get("log"),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return min(records, key=lambda r: r.time, default=None)


def started_by_hand(settings: Settings) -> bool:
    """A user script run as ``python train.py``: no launcher or service named this process
    (``$PERSIA_PROCESS`` of ``settings`` unset)."""
    return not _NAME and not settings.is_set(ENV_PROCESS)


def end_script_on_persia_errors(settings: Settings, depth: int = 2) -> None:
    """For a script started by hand (its ``__main__`` code entered a context): a PersiaError
    leaving the script is one line naming the script, its traceback goes to the log file,
    and the process ends at once, skipping interpreter finalization (which could hang in
    redis's connection ``__del__`` on an import lock). Any other exception is printed as
    Python prints it. ``depth``: frames between the script and this call; ``settings``: the
    context's, from which the hook names the process and its log folder."""
    if not started_by_hand(settings) or sys.excepthook in _HOOKS:
        return
    if sys._getframe(depth).f_globals.get("__name__") != "__main__":
        return  # a library or a test entered the context: its own process, its own hooks
    previous = sys.excepthook

    def hook(exc_type, exc, tb) -> None:
        if not isinstance(exc, PersiaError):
            previous(exc_type, exc, tb)
            return
        code = report(exc, settings)
        import atexit

        from pyrsia.shared.process_exit import exit_now

        atexit._run_exitfuncs()
        exit_now(code)

    _HOOKS.append(hook)
    sys.excepthook = hook


_HOOKS: list = []
"""The hooks :func:`end_script_on_persia_errors` installed (one is enough)."""
