"""Keep a process's freed heap memory for reuse instead of handing it back at every step.

A dense step allocates and frees the same activation and gradient buffers every batch
(1,024 x 512 floats is 2 MB). glibc's malloc serves blocks that large from ``mmap`` until
it has seen one freed, then from the heap, and gives the heap's free top back to the
kernel once it exceeds twice the largest block seen so far. Which block that is depends
on the process's history: the single-process baseline frees tens of MB of data arrays at
start and so keeps its buffers for good, while the NN worker, which never did, gave its
step's ~8 MB of temporaries back at the end of every step and took them again at the next
one, a page fault and a zeroed page per 4 KB. Measured on the Census-Income benchmark (1 NN
worker x 2 torch threads): ~760 page faults per step, most in the training threads' ReLU
and matmul kernels, backward 10.4 ms against the baseline's 8.7; with these settings 477
faults in 2 s (~6 per step) and backward 9.0 ms.

The services have the same pattern at a smaller scale: on the Criteo-shaped set the embedding
worker's ~1 MB request and answer bodies faulted ~130 pages a batch (8,400 in 2 s; 17 tuned)
and it used 0.15 of a core instead of 0.17-0.18. ``TrainCtx`` and both services call it as
they start.

:func:`keep_freed_memory` fixes both thresholds (``mallopt``, which also turns off glibc's
adjustment of them): blocks below 32 MB come from the heap, and up to 256 MB of free heap
top is kept. A process's resident memory then stays at its peak instead of shrinking
between steps. Settings the user made (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``GLIBC_TUNABLES`` with ``glibc.malloc``) are left as they
are; ``PERSIA_MALLOC_TUNING=0`` turns this off. Elsewhere than glibc (musl, macOS, an
``LD_PRELOAD`` allocator such as jemalloc, which manages its own reuse) it changes nothing
that matters.
"""

from __future__ import annotations

import ctypes
import functools
import sys

from pyrsia.shared.constants import (
    ENV_MALLOC_TUNING,
    MALLOC_MMAP_THRESHOLD_BYTES,
    MALLOC_TRIM_THRESHOLD_BYTES,
)
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

USER_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def malloc_tuning_enabled(settings: Settings) -> bool:
    """``PERSIA_MALLOC_TUNING``: 1 (the default when unset or empty) or 0."""
    value = settings.text(ENV_MALLOC_TUNING).strip() or "1"
    if value not in ("0", "1"):
        raise ConfigError(f"{ENV_MALLOC_TUNING} must be 0 or 1, got {value!r}")
    return value == "1"


def user_malloc_settings(settings: Settings) -> str | None:
    """The environment variable through which the user tuned malloc already, if any."""
    for name in USER_MALLOC_ENV:
        if settings.is_set(name):
            return name
    if "glibc.malloc" in settings.text("GLIBC_TUNABLES"):
        return "GLIBC_TUNABLES"
    return None


@functools.lru_cache(maxsize=1)
def keep_freed_memory(settings: Settings) -> str:
    """Apply the thresholds once per process (``settings``: the process's, from its entry
    point); returns what was done, for the caller's log (``"kept (...)"``, ``"off (...)"``,
    ``"left to the environment (...)"``, ...).

    Raises :class:`~pyrsia.shared.errors.ConfigError` on a bad ``PERSIA_MALLOC_TUNING``.
    """
    if not malloc_tuning_enabled(settings):
        outcome = f"off ({ENV_MALLOC_TUNING}=0)"
    elif (name := user_malloc_settings(settings)) is not None:
        outcome = f"left to the environment ({name} is set)"
    elif not sys.platform.startswith("linux"):
        outcome = "not applicable (not Linux)"
    else:
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            mallopt = None
        if mallopt is None:
            outcome = "not available (no mallopt in this C library)"
        elif (
            mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD_BYTES) == 1
            and mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_BYTES) == 1
        ):
            outcome = (
                f"kept (mmap threshold {MALLOC_MMAP_THRESHOLD_BYTES >> 20} MB, "
                f"trim threshold {MALLOC_TRIM_THRESHOLD_BYTES >> 20} MB)"
            )
        else:
            outcome = "not available (mallopt refused the thresholds)"
    return outcome
