"""``BaseCtx``, ``PreprocessMode`` and the current context (re-exported by :mod:`persia.ctx`)."""

from __future__ import annotations

import contextvars
import enum
import logging
from typing import Any

import torch

from persia import _current_ctx
from persia.errors import MisuseError
from pyrsia.services.nn_worker.precision import check_ctx_args
from pyrsia.shared.failure_report import end_script_on_persia_errors, note_failure
from pyrsia.shared.settings import Settings, current

_logger = logging.getLogger("persia.ctx")


class PreprocessMode(enum.Enum):
    """TRAIN: embeddings require grad; EVAL: no grad; INFERENCE: EVAL that needs no labels."""

    TRAIN = 1
    EVAL = 2
    INFERENCE = 3


def cnt_ctx() -> BaseCtx | None:
    """The innermost entered context of this thread / task, or None."""
    return _current_ctx.cnt_ctx()


current_ctx = cnt_ctx


def _cpu_if_negative(device_id):
    """PERSIA's contexts took any negative ``device_id`` (``-1`` in its examples) to mean the
    CPU; Pyrsia keeps that, with a warning, and documents ``device_id=None``."""
    if isinstance(device_id, int) and not isinstance(device_id, bool) and device_id < 0:
        _logger.warning(
            "device_id=%d: running on the CPU, as PERSIA did for a negative device_id; "
            "pass device_id=None to say so without this warning",
            device_id,
        )
        return None
    return device_id


class BaseCtx:
    """Common base of the contexts: device choice and current-context tracking.

    Arguments:
        threadpool_worker_size: accepted and checked for PERSIA compatibility, no effect (one
            event-loop thread sends; ``backward_workers_size`` bounds what is in flight).
        device_id: CUDA device for tensors and the model; None keeps everything on the CPU.
    """

    def __init__(self, threadpool_worker_size: int = 10, device_id: int | None = None):
        device_id = _cpu_if_negative(device_id)
        threadpool_worker_size, device_id = check_ctx_args(threadpool_worker_size, device_id)
        self.threadpool_worker_size = threadpool_worker_size
        self.device_id = device_id
        self._token: contextvars.Token | None = None
        self._entered = False
        self._common_context: Any = None
        self._settings: Settings | None = None

    @property
    def settings(self) -> Settings:
        """This process's settings: read when the context is entered, or when it connects
        outside ``with`` (PERSIA's API is an entry point), and passed down from here."""
        if self._settings is None:
            self._settings = current()
        return self._settings

    @property
    def common_context(self):
        """This context's :class:`persia.prelude.PersiaCommonContext` (PERSIA's handle on the
        services: ``wait_servers_ready``, ``configure_embedding_parameter_servers``, ...).
        It connects on first use; the connection ends with the context's ``with``."""
        if self._common_context is None:
            from persia.prelude import PersiaCommonContext

            self._common_context = PersiaCommonContext(
                self.threadpool_worker_size, device_id=self.device_id
            )
        return self._common_context

    def register_embedding_optimizer(self, optimizer: dict[str, Any]) -> None:
        """Register ``optimizer`` (``Optimizer.to_dict()``) with every PS replica of the job,
        through this context's connection (``persia.embedding.optim.Optimizer.apply``)."""
        session = self.common_context.session
        session.runtime.run(session.client.register_optimizer(optimizer))

    def _enter(self) -> None:
        """Hook: connect and prepare (subclasses)."""

    def _exit(self, failed: bool) -> None:
        """Hook: release what ``_enter`` took (subclasses)."""

    def __enter__(self):
        if self._entered:
            raise MisuseError(
                f"{type(self).__name__} is already entered; contexts are not reentrant"
            )
        if self.device_id is not None:
            torch.cuda.set_device(self.device_id)
        self._settings = current()  # entered: this process's settings, read now
        end_script_on_persia_errors(self.settings)  # `python train.py`: one line per error
        self._enter()
        self._entered = True
        self._token = _current_ctx.enter(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        note_failure(exc, self.settings)  # before _exit closes this rank's servers
        try:
            self._exit(failed=exc_type is not None)
            if self._common_context is not None:
                self._common_context.close()
        finally:
            self._entered = False
            if self._token is not None:
                _current_ctx.leave(self._token)
                self._token = None
