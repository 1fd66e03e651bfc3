"""``optimizer.num_apply_group``: the dense optimizer step applied in N parameter groups.

A torch optimizer's ``step`` (the default ``foreach`` implementation) makes its
temporary buffers for every parameter at once; stepping N disjoint groups of
parameters one after the other keeps only about 1/N of them alive at a time. Each
parameter's update depends only on its own gradient and state (SGD, Adam, AdamW,
Adagrad, RMSprop...), so the result is identical. Optimizers that look at all
parameters together (LBFGS, closures) are refused.
"""

from __future__ import annotations

import torch

from pyrsia.shared.errors import ConfigError, InvalidInputError


def split_groups(params: list[torch.Tensor], n: int) -> list[list[torch.Tensor]]:
    """``params`` in ``n`` contiguous groups of about equal element count (none empty)."""
    n = min(n, len(params))
    total = sum(p.numel() for p in params)
    groups: list[list[torch.Tensor]] = [[] for _ in range(n)]
    seen = 0
    for index, p in enumerate(params):
        # the group of this parameter's first element, never leaving later groups empty
        g = min(seen * n // max(total, 1), n - 1, index)
        g = max(g, n - (len(params) - index))
        groups[g].append(p)
        seen += p.numel()
    return [g for g in groups if g]


class GroupedApplyOptimizer(torch.optim.Optimizer):
    """Wraps ``optimizer``; ``step()`` applies it to one group of parameters at a time.

    Every other attribute (``param_groups``, ``state``, ``state_dict``, ``zero_grad``...)
    is the wrapped optimizer's, so checkpoints and LR schedulers see the original.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, num_apply_group: int):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InvalidInputError("optimizer", "a torch.optim.Optimizer", optimizer)
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ConfigError(
                "optimizer.num_apply_group > 1 cannot split LBFGS (it steps all parameters together)"
            )
        self.optimizer = optimizer
        self.num_apply_group = num_apply_group

    def __getattr__(self, name: str):
        if name.startswith("_"):  # torch internals (amp fused-step flags, hooks) stay ours
            raise AttributeError(name)
        return getattr(self.__dict__["optimizer"], name)

    @property
    def param_groups(self):  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self):  # type: ignore[override]
        return self.optimizer.state

    @property
    def defaults(self):  # type: ignore[override]
        return self.optimizer.defaults

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def add_param_group(self, param_group) -> None:
        self.optimizer.add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        """One step of the wrapped optimizer, applied group by group."""
        if closure is not None:
            raise ConfigError("optimizer.num_apply_group > 1: step(closure) is not supported")
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        groups = split_groups(params, self.num_apply_group)
        grads = {id(p): p.grad for p in params}
        try:
            for group in groups:
                members = {id(p) for p in group}
                for p in params:  # an optimizer skips parameters without a gradient
                    p.grad = grads[id(p)] if id(p) in members else None
                self.optimizer.step()
        finally:
            for p in params:
                p.grad = grads[id(p)]
        return None

    def __repr__(self) -> str:
        return f"GroupedApplyOptimizer({self.optimizer!r}, num_apply_group={self.num_apply_group})"
