"""``hb.scope``, ``hb.function`` and ``hb.wraps``: HybridBackend's entry points on torch.

::

    with hb.scope(sharding=True, grad_nbuckets=2):      # options for the block
        model = Model()                                  # its nn.EmbeddingBag: on the PS
        opt = torch.optim.SGD(model.parameters(), lr=0.1)  # its dense layers: data parallel
    # or, overlapping the all-reduce with backward:
    model = hb.wraps(model)                              # DDP, 2 gradient buckets
    opt = hb.wraps(MyOptimizer)(model.parameters(), lr=0.1)

    @hb.function(grad_nbuckets=2)                        # the same, as a decorator: a
    def build():                                         # returned nn.Module (alone or
        model = Model()                                  # in a tuple / list) is wrapped,
        return model, torch.optim.SGD(model.parameters(), lr=0.1)  # an optimizer too

Data parallel means what it means in HybridBackend (``hb.scope`` "rewrites variables and
optimizers for supporting data parallelism", docs/distributed.md): with several ranks,
every dense parameter made in the scope starts from rank 0's value and is trained with
the mean of the ranks' gradients, whichever torch optimizer steps it (see
:mod:`persia.hb._parallel` for where each all-reduce happens).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import torch
from torch.nn.modules import module as module_hooks

from persia.embedding.optim import SGD, Adam
from persia.embedding.optim import Optimizer as EmbeddingOptimizer
from persia.hb._context import Context, context
from persia.hb._parallel import (
    allreduce_gradients,
    broadcast_from_rank0,
    data_parallel,
    mark_replicated,
    needs_step_allreduce,
)
from persia.hb._ps import connection
from persia.hb._sharding import sharding_hooks
from pyrsia.shared.errors import InvalidTypeError

T = TypeVar("T")


class _Made:
    """The parameters and buffers registered while the outermost ``hb.scope`` is open.

    Held weakly: a temporary module made in the scope (``load_state_dict(Model().state_dict())``
    on rank 0 only) is gone when the scope ends and takes no part in the broadcast.
    """

    def __init__(self) -> None:
        self.params: dict[int, tuple[weakref.ref, int]] = {}  # id -> (param, grad_nbuckets)
        self.buffers: dict[int, weakref.ref] = {}

    def on_parameter(self, module: torch.nn.Module, name: str, param: Any) -> None:
        if isinstance(param, torch.nn.Parameter) and not param.is_meta:  # meta: a PS table stub
            self.params[id(param)] = (weakref.ref(param), context.options.grad_nbuckets)

    def on_buffer(self, module: torch.nn.Module, name: str, buffer: Any) -> None:
        if isinstance(buffer, torch.Tensor) and not buffer.is_meta:
            self.buffers[id(buffer)] = weakref.ref(buffer)

    def alive(self) -> tuple[list[tuple[torch.Tensor, int]], list[torch.Tensor]]:
        params = [(p, n) for ref, n in self.params.values() if (p := ref()) is not None]
        buffers = [b for ref in self.buffers.values() if (b := ref()) is not None]
        return params, buffers

    @contextmanager
    def recording(self) -> Iterator[None]:
        handles = [
            module_hooks.register_module_parameter_registration_hook(self.on_parameter),
            module_hooks.register_module_buffer_registration_hook(self.on_buffer),
        ]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()

    def make_data_parallel(self) -> None:
        """Rank 0's values everywhere; the gradients averaged before every ``step()``.

        Every rank must have made the same parameters and buffers (refused otherwise); a
        rank that made none takes no part, so a scope that only sets options costs nothing.
        """
        made, buffers = self.alive()
        params = needs_step_allreduce([p for p, _ in made])  # DDP broadcast hb.function's
        if not (params or buffers) or not context.init_process_group():
            return
        broadcast_from_rank0(params + buffers, "the parameters and buffers made in hb.scope")
        by_nbuckets: dict[int, list[torch.Tensor]] = {}
        for p, n in made:
            by_nbuckets.setdefault(n, []).append(p)
        for n, group in by_nbuckets.items():
            mark_replicated(group, n)


_OPEN = threading.local()


@contextmanager
def scope(**options: Any) -> Iterator[Context]:
    """Set ``hb.context.options`` for the block (validated; restored after it).

    With several ranks, every dense parameter (and buffer) made in the outermost scope
    is data parallel, as in HybridBackend: when the block ends, rank 0's values are
    broadcast to every rank, and before each ``step()`` of any torch optimizer the
    parameters' gradients are averaged over the ranks in ``grad_nbuckets`` buckets (the
    value in effect where the parameter was made), unless a DDP model from
    ``hb.wraps(model)`` / ``hb.function`` already averages them during backward. Every
    rank must make the same parameters in the same order (a mismatch is refused).

    With ``sharding=True`` in effect, ``torch.nn.Embedding`` / ``EmbeddingBag`` modules
    created in the block live on the embedding PS (:mod:`persia.hb.embedding`).
    """
    outermost = getattr(_OPEN, "made", None) is None
    with ExitStack() as stack:
        stack.enter_context(context.options.scoped(**options))
        if outermost and context.world_size > 1:
            made = _Made()
            _OPEN.made = made
            stack.callback(setattr, _OPEN, "made", None)
            stack.enter_context(made.recording())
        else:
            made = None
        if context.options.sharding:
            stack.enter_context(sharding_hooks())
        yield context
        if made is not None:
            made.make_data_parallel()


def function(**options: Any) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator: run the function inside ``hb.scope(**options)``.

    What it returns is made data parallel under the same options: a ``torch.nn.Module``
    (alone, or as an element of a returned tuple / list) becomes :func:`wraps` (DDP,
    ``grad_nbuckets`` buckets); a ``torch.optim.Optimizer`` element becomes an ``hb.wraps``
    optimizer. So ``return model, torch.optim.SGD(model.parameters(), lr=0.1)`` trains
    the same model on every rank.
    """
    context.options.validate(**options)  # a typo fails at decoration time, not at the call

    def decorate(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> T:
            with scope(**options):
                result = fn(*args, **kwargs)
                if isinstance(result, torch.nn.Module):
                    return data_parallel(result)  # type: ignore[return-value]
                if isinstance(result, (tuple, list)):
                    return _parallel_items(result)  # type: ignore[return-value]
                return result

        return wrapped

    return decorate


def _parallel_items(result: tuple | list) -> tuple | list:
    """``hb.function``'s tuple / list answer with its modules and optimizers made parallel."""
    items = [data_parallel(x) if isinstance(x, torch.nn.Module) else x for x in result]
    items = [wraps(x) if isinstance(x, torch.optim.Optimizer) else x for x in items]
    if isinstance(result, tuple) and hasattr(result, "_fields"):  # a namedtuple
        return type(result)(*items)
    return type(result)(items)


def embedding_optimizer_for(optimizer: torch.optim.Optimizer) -> EmbeddingOptimizer | None:
    """The PS optimizer with the same update rule as ``optimizer``, when there is one.

    torch SGD (no Nesterov, no dampening) and Adam (no AMSGrad) have exact counterparts;
    anything else (Adagrad: PERSIA's update order differs) returns None.
    """
    d = optimizer.defaults
    if isinstance(optimizer, torch.optim.SGD) and not d.get("nesterov") and not d.get("dampening"):
        return SGD(
            lr=float(d["lr"]),
            momentum=float(d.get("momentum", 0.0)),
            weight_decay=float(d.get("weight_decay", 0.0)),
        )
    if isinstance(optimizer, torch.optim.Adam) and not d.get("amsgrad"):
        return Adam(
            lr=float(d["lr"]),
            betas=tuple(d["betas"]),
            weight_decay=float(d.get("weight_decay", 0.0)),
            eps=float(d["eps"]),
        )
    return None


class _HBOptimizer:
    """Mixin of ``hb.wraps(OptimizerClass)``: rank 0's start; all-reduce what DDP does not.

    ``grad_nbuckets`` is the value in effect when the optimizer is made or wrapped, as
    HybridBackend reads it when ``hb.wraps`` is called (``wraps_optimizer``,
    hybridbackend/tensorflow/training/optimizer.py).
    """

    reduces_its_gradients = True  # the global step hook of persia.hb._parallel skips it

    def _hb_setup(self) -> None:
        connection.suggest_optimizer(embedding_optimizer_for(self))  # type: ignore[arg-type]
        self.allreduce_calls = 0
        self.grad_nbuckets = context.options.grad_nbuckets
        params = needs_step_allreduce(self._hb_params())
        if params and context.init_process_group():
            broadcast_from_rank0(params, f"the parameters of {type(self).__name__}")

    def _hb_params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]  # type: ignore[attr-defined]

    def step(self, closure=None):  # noqa: D102 - torch's signature
        params = needs_step_allreduce(self._hb_params())
        if params and context.init_process_group():
            self.allreduce_calls += allreduce_gradients(params, self.grad_nbuckets)
        return super().step(closure)  # type: ignore[misc]


@functools.cache
def _wrap_optimizer_class(cls: type) -> type:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls.__init__(self, *args, **kwargs)
        self._hb_setup()

    return type(
        f"HB{cls.__name__}",
        (_HBOptimizer, cls),
        {"__init__": __init__, "__module__": cls.__module__, "__doc__": cls.__doc__},
    )


def wraps(target: Any) -> Any:
    """HybridBackend's ``hb.wraps`` for torch objects.

    - a ``torch.optim.Optimizer`` subclass (torch's or the user's own) -> a subclass
      whose instances start from rank 0's parameters (broadcast when made) and whose
      ``step()`` first averages, in ``grad_nbuckets`` buckets, the gradients no DDP
      model reduced (all of them with ``grad_lazy_sync``, which makes no DDP); torch
      SGD / Adam settings also become the embedding PS's optimizer;
    - an optimizer instance -> the same object, re-classed to that subclass (its
      parameters are broadcast from rank 0 at once, before its first step);
    - a ``torch.nn.Module`` instance -> :func:`persia.hb._parallel.data_parallel`: DDP,
      or with ``grad_lazy_sync`` the module itself with rank 0's parameters and buffers.

    Buffers are broadcast only where the module is known (a module made in ``hb.scope``
    or passed here); an optimizer alone knows only its parameters.
    """
    if isinstance(target, type) and issubclass(target, torch.optim.Optimizer):
        if issubclass(target, _HBOptimizer):
            return target
        return _wrap_optimizer_class(target)
    if isinstance(target, torch.optim.Optimizer):
        if not isinstance(target, _HBOptimizer):
            target.__class__ = _wrap_optimizer_class(type(target))
            target._hb_setup()
        return target
    if isinstance(target, torch.nn.Module):
        return data_parallel(target)
    raise InvalidTypeError(
        "target",
        "a torch.optim.Optimizer class or instance, or a torch.nn.Module",
        message="hb.wraps: expected a torch.optim.Optimizer class or instance, or a torch.nn.Module, "
        f"got {type(target).__name__}",
    )
