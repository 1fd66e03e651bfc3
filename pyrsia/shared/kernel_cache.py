"""Drop a module's cached numba kernels when a module they inline has changed.

numba's on-disk cache (``cache=True``) checks only the source file of the kernel itself: a
kernel that inlines jitted functions of another module (the PS kernels inline the
optimizers' update rules and the hash table's probes) goes on running the machine code
compiled from the old version of that module after it is edited, until its own file
changes. :func:`drop_if_inlined_changed`, called at the top of the kernel module, keeps a
fingerprint of the inlined modules beside the cache and deletes the module's cached
kernels when the fingerprint differs, so they are compiled again from the current sources.

It looks after the cache numba keeps in the module's ``__pycache__`` (a checkout, where
sources are edited); a cache kept elsewhere (``NUMBA_CACHE_DIR``, or a read-only install,
whose files change only by reinstalling, which numba notices) is left alone.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from numba.core import config as numba_config


def fingerprint(paths: Sequence[Path]) -> str:
    """A digest of the files' names and contents."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def drop_if_inlined_changed(module_file: str, inlined: Sequence[str]) -> bool:
    """Delete the cached kernels of ``module_file`` when the files ``inlined`` (names in
    its directory) differ from when the cache was last checked; True when it deleted any.

    With no fingerprint yet, what is cached is dropped once: nothing says which sources it
    was built from.
    """
    if numba_config.CACHE_DIR:  # NUMBA_CACHE_DIR, as numba read it
        return False
    source = Path(module_file)
    cache = source.parent / "__pycache__"
    try:
        now = fingerprint([source.parent / name for name in inlined])
        stamp = cache / f"{source.stem}.inlined.sha256"
        if stamp.is_file() and stamp.read_text() == now:
            return False
        cache.mkdir(exist_ok=True)  # numba's own choice of place when it can write there
        dropped = False
        for entry in cache.iterdir():
            if entry.name.startswith(f"{source.stem}.") and entry.suffix in (".nbi", ".nbc"):
                entry.unlink(missing_ok=True)
                dropped = True
        partial = stamp.with_name(f"{stamp.name}.{os.getpid()}")
        partial.write_text(now)
        partial.replace(stamp)  # atomic: a process starting now reads the old or the new one
    except OSError:  # a read-only checkout: numba then caches elsewhere or not at all
        return False
    return dropped
