"""The innermost entered persia context of this thread / task (``persia.ctx.cnt_ctx``).

A leaf module: the contexts set it, and code below them (``Optimizer.apply``) reads it
without importing the contexts.
"""

from __future__ import annotations

import contextvars
from typing import Any

_CURRENT: contextvars.ContextVar[Any] = contextvars.ContextVar("persia_ctx", default=None)


def cnt_ctx() -> Any:
    """The innermost entered context of this thread / task (a ``BaseCtx``), or None."""
    return _CURRENT.get()


def enter(ctx: Any) -> contextvars.Token:
    """Make ``ctx`` the current context; the token undoes it (:func:`leave`)."""
    return _CURRENT.set(ctx)


def leave(token: contextvars.Token) -> None:
    """Undo the :func:`enter` that returned ``token``."""
    _CURRENT.reset(token)
