"""``hb.context``: where this process sits in the job, and the options.

::

    import persia.hb as hb
    print(f"{hb.context.rank}-of-{hb.context.world_size}")   # 0-of-1 outside a launcher
    hb.context.options.grad_nbuckets = 2

``rank``, ``world_size`` and ``local_rank`` come from ``RANK`` / ``WORLD_SIZE`` /
``LOCAL_RANK`` (set by ``python -m persia.hb.run`` or ``persia-launcher nn-worker``,
both torch's launcher); a process started without one is rank 0 of 1. The values
are read on first access (never at import) through :mod:`persia.env`.

:meth:`Context.init_process_group` joins torch.distributed once per process, with
``env://`` rendezvous (torch's launcher sets ``MASTER_ADDR`` / ``MASTER_PORT``) and
the backend of ``options.comm_default`` (``auto``: nccl with CUDA, gloo without).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import threading

import torch

from persia import env
from persia.hb._options import Options
from pyrsia.shared.constants import HB_LEAVE_BARRIER_S as LEAVE_BARRIER_S
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings, current

log = logging.getLogger(__name__)


class Context:
    """Cluster facts of this process plus :attr:`options`; one instance, ``hb.context``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._options: Options | None = None
        self._owns_group = False

    @property
    def options(self) -> Options:
        """The process-wide :class:`~persia.hb._options.Options` (env read on first use)."""
        with self._lock:
            if self._options is None:
                self._options = Options()
            return self._options

    @property
    def settings(self) -> Settings:
        """This process's settings, read now: HybridBackend's API reads the environment when
        asked, as PERSIA's ``persia.env`` getters do (an entry point)."""
        return current()

    @property
    def rank(self) -> int:
        """Global rank of this process (``RANK``; 0 without a launcher)."""
        return env.get_rank() or 0

    @property
    def world_size(self) -> int:
        """Number of ranks (``WORLD_SIZE``; 1 without a launcher)."""
        return env.get_world_size() or 1

    @property
    def local_rank(self) -> int:
        """Rank on this machine (``LOCAL_RANK``; 0 without a launcher)."""
        return env.get_local_rank() or 0

    @property
    def is_chief(self) -> bool:
        """True on rank 0 (the rank that writes checkpoints and exports)."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """``cuda:<local_rank>`` when CUDA is available, else the CPU."""
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return torch.device("cpu")

    def backend(self) -> str:
        """The torch.distributed backend ``comm_default`` resolves to."""
        choice = self.options.comm_default
        if choice == "auto":
            return "nccl" if torch.cuda.is_available() else "gloo"
        if choice == "nccl" and not torch.cuda.is_available():
            raise ConfigError("hb.context.options.comm_default='nccl' needs CUDA; use 'gloo'")
        return choice

    def init_process_group(self) -> bool:
        """Join torch.distributed when ``world_size > 1`` (once); True when a group exists."""
        if torch.distributed.is_initialized():
            return True
        if self.world_size <= 1:
            return False
        settings = self.settings
        missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if not settings.is_set(k)]
        if missing:
            raise ConfigError(
                f"WORLD_SIZE={self.world_size} but {', '.join(missing)} not set: start the ranks "
                "with `python -m persia.hb.run python train.py` or `persia-launcher nn-worker`"
            )
        backend = self.backend()
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        torch.distributed.init_process_group(
            backend, init_method="env://", rank=self.rank, world_size=self.world_size
        )
        self._owns_group = True
        # Left at interpreter exit too: a script that ends (or exits on an error) with the group
        # still alive can abort in gloo's teardown ("terminate called without an active
        # exception", exit -6) instead of exiting with its own code.
        atexit.register(self._leave, meet_peers=False)
        log.info("rank %d/%d joined the %s process group", self.rank, self.world_size, backend)
        return True

    def destroy_process_group(self) -> None:
        """Leave the process group this context created (no-op otherwise).

        With gloo and more than one rank, the ranks first meet at a barrier, so none closes
        its connections (and rank 0 the rendezvous store it hosts) while a peer still tears
        down its own: a rank whose peer vanished mid-teardown can abort in gloo ("terminate
        called without an active exception", exit -6) after its work is done. A peer that
        never comes is named after ``LEAVE_BARRIER_S`` and the group is left all the same.
        """
        self._leave(meet_peers=True)

    def _leave(self, *, meet_peers: bool) -> None:
        """Destroy the owned group; at interpreter exit (``meet_peers=False``) the peers may
        have failed, so nobody waits for them there."""
        if self._owns_group and torch.distributed.is_initialized():
            if meet_peers:
                _meet_peers_before_leaving()
            torch.distributed.destroy_process_group()
        self._owns_group = False

    def __repr__(self) -> str:
        return (
            f"Context(rank={self.rank}, world_size={self.world_size}, local_rank={self.local_rank})"
        )


def _meet_peers_before_leaving() -> None:
    """A bounded gloo barrier of every rank; a missing one is logged, never waited on forever."""
    if torch.distributed.get_world_size() < 2 or torch.distributed.get_backend() != "gloo":
        return
    try:
        torch.distributed.monitored_barrier(
            timeout=datetime.timedelta(seconds=LEAVE_BARRIER_S), wait_all_ranks=True
        )
    except RuntimeError as exc:
        log.warning("leaving the process group without every peer: %s", exc)


context = Context()
