"""Embedding optimizers, PERSIA's names and defaults, applied on the embedding servers.

Each class validates every argument at construction (through the shared spec it
wraps) and every argument reaches the server: unlike PERSIA, ``SGD(momentum=...)``
and ``weight_decay`` on Adam and Adagrad are honoured, not dropped.

``TrainCtx`` sends ``optimizer.to_dict()`` to the embedding parameter servers.
"""

from __future__ import annotations

from typing import Any

from persia._current_ctx import cnt_ctx
from pyrsia.shared.embedding_spec import (
    AdagradSpec,
    AdamSpec,
    OptimizerSpec,
    SGDSpec,
    optimizer_from_dict,
    optimizer_to_dict,
)
from pyrsia.shared.errors import MisuseError

__all__ = ["SGD", "Adagrad", "Adam", "Optimizer"]


class Optimizer:
    """Base class: holds the validated :attr:`spec` that is sent to the servers."""

    def __init__(self, spec: OptimizerSpec):
        self._spec = spec

    @property
    def spec(self) -> OptimizerSpec:
        """The validated, immutable optimizer spec shared with the servers."""
        return self._spec

    def to_dict(self) -> dict[str, Any]:
        """The wire form, e.g. ``{"type": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0}``."""
        return optimizer_to_dict(self._spec)

    def apply(self) -> None:
        """Register this optimizer with every PS replica of the job, through the innermost
        entered context (PERSIA's ``Optimizer.apply``; ``TrainCtx`` calls it on enter)."""
        ctx = cnt_ctx()
        if ctx is None:
            raise MisuseError(
                "Optimizer.apply() registers the optimizer through the current context: call it "
                "inside `with eval_ctx() as ctx:` (or another persia context)"
            )
        ctx.register_embedding_optimizer(self.to_dict())

    @staticmethod
    def from_dict(data: object) -> Optimizer:
        """Rebuild the optimizer from :meth:`to_dict`'s form (validated; errors name the field)."""
        spec = optimizer_from_dict(data)
        cls = {SGDSpec: SGD, AdamSpec: Adam, AdagradSpec: Adagrad}[type(spec)]
        obj = cls.__new__(cls)
        Optimizer.__init__(obj, spec)
        return obj

    def __getattr__(self, name: str) -> Any:
        # lr, momentum, betas, ... read through to the spec, as PERSIA's attributes did.
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return getattr(self._spec, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}") from None

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "type")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.spec == self.spec

    def __hash__(self) -> int:
        return hash(self._spec)


class SGD(Optimizer):
    """SGD with PyTorch's momentum semantics (a buffer per entry) and L2 weight decay.

    Arguments:
        lr: learning rate, > 0.
        momentum: momentum factor in [0, 1).
        weight_decay: L2 penalty factor, >= 0.
    """

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        super().__init__(SGDSpec(lr=lr, momentum=momentum, weight_decay=weight_decay))


class Adam(Optimizer):
    """Adam with PyTorch's semantics (L2 weight decay, bias correction with a step per entry).

    Arguments:
        lr: learning rate, > 0.
        betas: running-average factors for the gradient and its square, each in [0, 1).
        weight_decay: L2 penalty factor, >= 0.
        eps: added to the denominator, > 0.
    """

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0,
        eps: float = 1e-8,
    ):
        super().__init__(AdamSpec(lr=lr, betas=betas, weight_decay=weight_decay, eps=eps))


class Adagrad(Optimizer):
    """PERSIA's Adagrad.

    ``w -= lr * (g + weight_decay * w) / sqrt(a + eps)``, then
    ``a = a * g_square_momentum + g**2``; ``a`` starts at ``initial_accumulator_value``.

    Arguments:
        lr: learning rate, > 0.
        initial_accumulator_value: starting accumulator, >= 0.
        weight_decay: L2 penalty factor, >= 0.
        g_square_momentum: decay of the accumulator, in (0, 1].
        eps: added under the square root, > 0.
        vectorwise_shared: keep one accumulator per embedding (updated with mean(g**2))
            instead of one per element.
    """

    def __init__(
        self,
        lr: float = 1e-2,
        initial_accumulator_value: float = 1e-2,
        weight_decay: float = 0,
        g_square_momentum: float = 1,
        eps: float = 1e-10,
        vectorwise_shared: bool = False,
    ):
        super().__init__(
            AdagradSpec(
                lr=lr,
                initial_accumulator_value=initial_accumulator_value,
                weight_decay=weight_decay,
                g_square_momentum=g_square_momentum,
                eps=eps,
                vectorwise_shared=vectorwise_shared,
            )
        )
