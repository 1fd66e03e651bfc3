"""A child process ends when the process that started it dies, even by ``kill -9``.

Linux's ``PR_SET_PDEATHSIG`` asks the kernel to send a signal when the parent exits. Every
supervisor in Pyrsia uses it for its children: ``persia-launcher run`` for the job's
processes, the local Redis supervisor for redis-server, the serving pool for its workers,
and each NN-worker rank for itself (its parent is torch's agent). Elsewhere it is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send ``sig`` to this process when its parent dies.

    Safe as a ``subprocess.Popen(preexec_fn=...)`` (it only calls ``prctl``). Called in a
    running process instead, the parent may already be gone: :func:`orphaned` tells.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig))
    except (OSError, AttributeError):
        pass


def die_with_parent_sigkill() -> None:
    """:func:`die_with_parent` with SIGKILL, for children that have nothing to drain."""
    die_with_parent(signal.SIGKILL)


def orphaned(parent_pid: int) -> bool:
    """Whether the process that started this one (``parent_pid``) is gone already."""
    return os.getppid() != parent_pid
