"""A PS checkpoint's disk errors, as the client should see them.

``checkpoint_io`` runs a dump or load: a directory path that cannot be used (``PATH_ERRNOS``,
or a path Python refuses) is the caller's mistake, a 400 naming ``dir``; a disk that fails
(full, I/O error) is a 503 the caller may retry. Errors of the project's tree pass through.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any, TypeVar

from pyrsia.shared.errors import InvalidInputError, PersiaError, ServiceUnavailableError

T = TypeVar("T")

PATH_ERRNOS = frozenset(
    {
        errno.ENOTDIR,
        errno.EEXIST,
        errno.ENOENT,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENAMETOOLONG,
        errno.EINVAL,
        errno.EISDIR,
        errno.ELOOP,
    }
)


def checkpoint_io(fn: Callable[..., T], directory: str, *args: Any) -> T:
    """Run a dump or load; a path that cannot be used is a 400 naming ``dir`` (not a 500),
    and a failing disk (full, I/O error) a 503 the caller may retry."""
    try:
        return fn(directory, *args)
    except PersiaError:
        raise
    except ValueError as exc:  # e.g. "embedded null byte"
        raise InvalidInputError("dir", f"a usable directory path ({exc})", directory) from exc
    except OSError as exc:
        if exc.errno in PATH_ERRNOS:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            raise InvalidInputError(
                "dir", f"a directory this PS can create, read and write ({why})", directory
            ) from exc
        raise ServiceUnavailableError(f"checkpoint I/O in {directory!r} failed: {exc}") from exc
