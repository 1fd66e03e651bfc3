"""What ``hb.scope(sharding=True)`` does to torch embeddings created inside it.

Three process-wide hooks are installed while at least one sharding scope is open
(nested scopes share them):

1. a ``TorchFunctionMode`` that allocates the ``torch.empty`` table of
   ``nn.Embedding.__init__`` / ``nn.EmbeddingBag.__init__`` on the ``meta`` device,
   so a table of 10^12 rows costs no memory (only those two constructors' own
   calls are redirected; every other tensor is untouched);
2. a parameter-registration hook that turns the module into its sharded subclass
   (:mod:`persia.hb.embedding`) the moment its ``weight`` is registered; the
   subclass's ``reset_parameters`` then drops that stub, so the module has no
   parameter (DDP, optimizers and ``state_dict`` do not see a table);
3. a module-registration hook that names the table's slot after the attribute it
   is assigned to (``self.user = nn.EmbeddingBag(...)`` -> slot ``user``).

Only exact ``nn.Embedding`` / ``nn.EmbeddingBag`` instances are sharded (a user's
subclass is left alone), and a preset table (``_weight=``, ``from_pretrained``) is
refused: the PS initializes its rows itself.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch.nn.modules import module as module_hooks
from torch.overrides import TorchFunctionMode

from persia.hb.embedding import SHARDED_CLASSES
from pyrsia.shared.errors import InvalidInputError

_CONSTRUCTORS = frozenset(cls.__init__.__code__ for cls in SHARDED_CLASSES)


class _MetaTables(TorchFunctionMode):
    """``torch.empty`` called by the embedding constructors themselves lands on ``meta``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.empty and sys._getframe(1).f_code in _CONSTRUCTORS:
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


def _on_parameter(module: torch.nn.Module, name: str, param):
    sharded = SHARDED_CLASSES.get(type(module))
    if sharded is None or name != "weight":
        return None
    if param is None or not param.is_meta:
        raise InvalidInputError(
            f"{type(module).__name__}(_weight=...)",
            "no preset table inside hb.scope(sharding=True): the embedding PS initializes "
            "the rows (create the module outside the scope to keep a local, preset table)",
            "a preset weight",
        )
    module.__class__ = sharded
    module._hb_init()
    return None


def _on_module(parent: torch.nn.Module, name: str, submodule):
    if (
        isinstance(submodule, tuple(SHARDED_CLASSES.values()))
        and submodule.slot is None
        and name.isidentifier()
    ):
        submodule.slot = name
    return None


class _Hooks:
    """Reference-counted installation of the global hooks (nested scopes share one set)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._handles: list = []

    def acquire(self) -> None:
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self._handles = [
                    module_hooks.register_module_parameter_registration_hook(_on_parameter),
                    module_hooks.register_module_module_registration_hook(_on_module),
                ]

    def release(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                for handle in self._handles:
                    handle.remove()
                self._handles = []


_HOOKS = _Hooks()


@contextmanager
def sharding_hooks() -> Iterator[None]:
    """Shard the torch embeddings created in this block (see the module docstring)."""
    with ExitStack() as stack:
        _HOOKS.acquire()
        stack.callback(_HOOKS.release)
        stack.enter_context(_MetaTables())
        yield
