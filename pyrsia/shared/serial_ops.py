"""Torch ops called on the runtime's event-loop thread run on that thread alone.

The loop thread builds each batch's tensors (``index_select``, ``unbind``) and reads the
gradients back. With torch's OpenMP backend a large op there opens a parallel region of
its own, and OpenMP gives each calling thread its own team: a second set of worker threads
that wakes for every batch and competes for the cores with the training thread's team. On
a machine with as many cores as torch threads, every such wake-up preempts the training
step (issue 10). The loop thread's ops are small; run serially they cost less than the
hand-off.

OpenMP's thread count is a per-thread setting (the ``nthreads-var`` ICV), so calling
``omp_set_num_threads(1)`` on the loop thread leaves the training thread's parallelism
alone, unlike ``torch.set_num_threads``, which also changes what threads started later get.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

_OPENMP_LIBRARIES = ("libgomp", "libiomp", "libomp")


def _loaded_openmp() -> str | None:
    """Path of the OpenMP runtime loaded in this process (None if there is none)."""
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                path = line.rsplit(maxsplit=1)[-1]
                name = path.rsplit("/", 1)[-1]
                if path.startswith("/") and name.startswith(_OPENMP_LIBRARIES):
                    return path
    except OSError:  # not Linux
        return None
    return None


def run_torch_ops_serially_on_this_thread() -> bool:
    """Make torch's intra-op parallelism 1 for the calling thread only; True if it took.

    Where torch is not imported yet (a process that never runs a torch op), torch does not
    use OpenMP (its native pool is shared by every thread, so no second team exists) or the
    OpenMP runtime cannot be found, nothing changes and False is returned.
    """
    torch = sys.modules.get("torch")  # not imported here: the runtime does not need torch
    if torch is None:
        return False
    if torch.get_num_threads() <= 1:
        return True
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return False
    path = _loaded_openmp()
    if path is None:
        return False
    try:
        ctypes.CDLL(path).omp_set_num_threads(1)
    except (OSError, AttributeError) as exc:
        log.debug("could not make this thread's torch ops serial (%s): %s", path, exc)
        return False
    return torch.get_num_threads() == 1
