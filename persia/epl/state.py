"""The EPL config of this process: set only by :func:`init`, read by ``TrainCtx``.

Nothing is read from the environment at import: ``init()`` without a config builds
``Config()`` then (which reads the ``EPL_*`` variables at that moment).
"""

from __future__ import annotations

import atexit
import logging

from persia.epl.cluster import apply_cluster_config
from persia.epl.config import KEYS, Config
from pyrsia.shared.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)

_current: Config | None = None
_clip_norm: float | None = None
_io_read = False  # slice_files / FileListDataset ran in this process
_io_reported = False  # a TrainCtx already said that it does not read io.*
_exit_check_registered = False

IO_KEYS = ("io.slicing", "io.unbalanced_io_slicing", "io.drop_last_files")


def init(config: Config | None = None) -> Config:
    """Make ``config`` (default: ``Config()`` from the environment) this process's EPL config.

    Applies the cluster keys at once (``cluster.run_visible_devices`` must be set
    before CUDA starts); every later ``TrainCtx`` without ``epl_config=`` uses it.
    """
    global _current
    if config is None:
        config = Config()
    if not isinstance(config, Config):
        raise InvalidInputError("config", "a persia.epl.Config (or None)", config)
    apply_cluster_config(config)
    _current = config
    log.info("EPL config: %r", config)
    _watch_io_keys(config)
    return config


def _watch_io_keys(config: Config) -> None:
    """io.* set in ``init``: at exit, warn if nothing in this process read them."""
    global _exit_check_registered
    if _exit_check_registered or not any(config.get(k) != KEYS[k].default for k in IO_KEYS):
        return
    _exit_check_registered = True
    atexit.register(_warn_unread_io_keys)


def _warn_unread_io_keys() -> None:
    config = _current
    if config is None or _io_read or _io_reported:
        return
    keys = [k for k in IO_KEYS if config.get(k) != KEYS[k].default]
    if keys:
        log.warning(
            "%s set in persia.epl.init but never read in this process: io.* take effect only "
            "where data_loader.py calls persia.epl.slice_files(files) or "
            "persia.epl.FileListDataset(files, read), which pick each data loader's share of "
            "the files; without them every data loader read what it read before",
            ", ".join(keys),
        )


def note_io_read() -> None:
    """Called by :func:`persia.epl.slice_files`: the io.* keys were read in this process."""
    global _io_read
    _io_read = True


def note_io_reported() -> None:
    """Called by a TrainCtx's plan after warning that it does not read io.*."""
    global _io_reported
    _io_reported = True


def current_config() -> Config | None:
    """The config given to the last :func:`init`, or None when init was never called."""
    return _current


def clip_by_global_norm(max_norm: float | None) -> None:
    """Clip the dense gradients to global L2 norm ``max_norm`` at every step (None: off).

    EPL users clip in their graph (``tf.clip_by_global_norm``); in Pyrsia the step runs
    inside ``ctx.backward``, so the norm is registered here. Whether the local or the
    all-reduced gradients are clipped is ``communication.clip_after_allreduce``.

    The norm is read at every step, so calling this before or after the ``TrainCtx`` is
    built (or inside its ``with`` block) applies from the next step; ``None`` stops
    clipping. A ``TrainCtx`` built with no EPL config while a norm is registered gets
    EPL's defaults plus the clipping. Only a ``TrainCtx`` that was built with no EPL
    config and no norm cannot clip: calling this inside its ``with`` block raises
    ``ConfigError`` (register the norm before building the context).
    """
    global _clip_norm
    if max_norm is not None and (
        isinstance(max_norm, bool) or not isinstance(max_norm, (int, float)) or not max_norm > 0
    ):
        raise InvalidInputError("max_norm", "a number > 0 (or None to stop clipping)", max_norm)
    if max_norm is not None:
        _refuse_inside_plain_trainctx()
    _clip_norm = None if max_norm is None else float(max_norm)


def _refuse_inside_plain_trainctx() -> None:
    from persia.ctx import TrainCtx, cnt_ctx  # the contexts' stack: loaded only when asked

    ctx = cnt_ctx()
    if isinstance(ctx, TrainCtx) and ctx.epl_plan is None:
        raise ConfigError(
            "persia.epl.clip_by_global_norm: the running TrainCtx was built without EPL "
            "options, so it has no clipping step; call clip_by_global_norm(max_norm) before "
            "TrainCtx(...) is built (or pass epl_config=persia.epl.Config(...) to it)"
        )


def current_clip_norm() -> float | None:
    """The norm given to :func:`clip_by_global_norm`, or None."""
    return _clip_norm


def reset() -> None:
    """Forget the config and clip norm set by :func:`init` (tests; a job calls init once)."""
    global _current, _clip_norm, _io_read, _io_reported
    _current, _clip_norm, _io_read, _io_reported = None, None, False, False
