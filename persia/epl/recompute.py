"""``gradient_checkpoint.*``: recompute blocks' activations in backward instead of keeping them.

EPL calls this gradient checkpointing and its keys keep EPL's names; the module is named
for what it does, apart from the checkpoints of a job (``pyrsia.services.nn_worker``) and
of the embedding PS (``pyrsia.services.embedding_ps.checkpoint``).

- ``type = "auto"``: the model's repeated blocks (children of a ``Sequential`` /
  ``ModuleList`` that occur at least twice with the same class and parameter shapes,
  e.g. transformer layers or residual blocks) run under ``torch.utils.checkpoint``.
- ``type = "collection"``: the modules the user marked with :func:`add_to_collection`
  (EPL's ``tf.add_to_collection("checkpoints", tensor)``, on modules instead of tensors).
- ``end_taskgraph``: EPL's last TaskGraph to checkpoint; a Pyrsia NN worker runs the
  whole dense model as one TaskGraph, so here it is the index of the last block (in
  forward order) to checkpoint; -1 = all.
- ``check_gradients``: on the first training step (in ``ctx.forward``, before any
  backward or optimizer step), the gradients of the checkpointed model are compared
  with a plain backward of the same inputs; the max difference is logged (and kept in
  :attr:`GradientCheck.max_diff`). A difference above the tolerance (``CHECK_ATOL`` +
  ``CHECK_RTOL`` x the largest plain gradient) raises ``ConfigError`` naming both, so
  no step is taken with wrong gradients: EPL refuses too (``epl/runtime/gc/
  gradient_checkpoint.py`` asserts that the checkpointed and the plain gradients agree
  when ``check_gradients`` is set). EPL compares the two gradient graphs (shapes, op
  types); Pyrsia, which has no graph, compares their values on the first batch.

Blocks are checkpointed in place (their ``forward`` is wrapped), so parameter names and
checkpoints do not change; evaluation (no autograd) runs the plain forward. The
recomputation in backward, and the check's two extra passes, put back the buffers they
write (:func:`persia.epl.buffers.buffers_kept`), so BatchNorm statistics move once per
step, as without checkpointing (torch's ``checkpoint`` alone would move them twice).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from persia.epl.buffers import buffers_kept
from persia.epl.config import Config
from pyrsia.shared.errors import ConfigError, InvalidInputError

log = logging.getLogger(__name__)

CHECK_ATOL = 1e-6
"""``check_gradients``: absolute part of the tolerance."""
CHECK_RTOL = 1e-3
"""``check_gradients``: relative part, times the largest plain gradient (bf16 autocast
recomputes in the same precision, so a correct block differs by far less)."""

_MARK = "_epl_gradient_checkpoint"
_WRAPPED = "_epl_checkpointed"
_disabled = [False]


def add_to_collection(module: nn.Module, collection: str = "checkpoints") -> nn.Module:
    """Mark ``module`` for ``gradient_checkpoint.type = "collection"``; returns it."""
    if not isinstance(module, nn.Module):
        raise InvalidInputError("module", "a torch.nn.Module to checkpoint", module)
    if collection != "checkpoints":
        raise InvalidInputError(
            "collection", '"checkpoints" (the only collection EPL reads)', collection
        )
    setattr(module, _MARK, True)
    return module


@contextlib.contextmanager
def plain_backward() -> Iterator[None]:
    """Run checkpointed blocks without checkpointing inside this block."""
    _disabled[0], before = True, _disabled[0]
    try:
        yield
    finally:
        _disabled[0] = before


def _signature(module: nn.Module) -> tuple:
    return (type(module), tuple(tuple(p.shape) for p in module.parameters()))


def find_repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """Children of containers that repeat (same class and parameter shapes, >= 2 times)."""
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for container in model.modules():
        if id(container) in inside or not isinstance(container, (nn.Sequential, nn.ModuleList)):
            continue
        children = [c for c in container.children() if any(True for _ in c.parameters())]
        counts: dict[tuple, int] = {}
        for child in children:
            counts[_signature(child)] = counts.get(_signature(child), 0) + 1
        for child in children:
            if counts[_signature(child)] >= 2 and id(child) not in inside:
                blocks.append(child)
                inside.update(id(m) for m in child.modules())
    return blocks


def _checkpointed(original, module: nn.Module, *args, **kwargs):
    if _disabled[0] or not torch.is_grad_enabled():
        return original(*args, **kwargs)
    first = [True]

    def run(*inner_args, **inner_kwargs):
        if first[0]:
            first[0] = False
            return original(*inner_args, **inner_kwargs)
        with buffers_kept(module):  # the recomputation in backward: BN statistics untouched
            return original(*inner_args, **inner_kwargs)

    return checkpoint(run, *args, use_reentrant=False, **kwargs)


def apply_gradient_checkpoint(model: nn.Module, config: Config) -> list[nn.Module]:
    """Wrap the selected blocks' forward in ``torch.utils.checkpoint``; returns them."""
    kind = config.gradient_checkpoint.type
    if not kind:
        return []
    if kind == "auto":
        blocks = find_repeated_blocks(model)
        if not blocks:
            log.warning(
                'gradient_checkpoint.type "auto": no repeated blocks in %s, nothing is '
                'checkpointed (mark modules with persia.epl.add_to_collection and use "collection")',
                type(model).__name__,
            )
    else:
        blocks = [m for m in model.modules() if getattr(m, _MARK, False)]
        if not blocks:
            raise ConfigError(
                'gradient_checkpoint.type "collection": no module of the model is marked; '
                "call persia.epl.add_to_collection(module) on the blocks to checkpoint"
            )
    end = config.gradient_checkpoint.end_taskgraph
    if end >= 0:
        blocks = blocks[: end + 1]
    for block in blocks:
        if not getattr(block, _WRAPPED, False):
            block.forward = functools.partial(_checkpointed, block.forward, block)
            setattr(block, _WRAPPED, True)
    log.info(
        "gradient_checkpoint %s: %d blocks checkpointed (%s)",
        kind,
        len(blocks),
        ", ".join(sorted({type(b).__name__ for b in blocks})) or "none",
    )
    return blocks


class GradientCheck:
    """``check_gradients``: checkpointed vs plain gradients of one batch, once."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.max_diff: float | None = None
        self.tolerance: float | None = None

    def __call__(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]) -> None:
        def grads() -> list[torch.Tensor]:
            xs = [e.detach().requires_grad_(e.is_floating_point()) for e in embeddings]
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                out = self.model([x.detach() for x in non_id], xs)
            outs = [out] if isinstance(out, torch.Tensor) else list(out)
            gen = torch.Generator(device="cpu").manual_seed(1)
            probe = sum(
                (o.float() * torch.randn(o.shape, generator=gen).to(o.device)).sum() for o in outs
            )
            wrt = [p for p in self.model.parameters() if p.requires_grad] + [
                x for x in xs if x.requires_grad
            ]
            got = torch.autograd.grad(probe, wrt, allow_unused=True)
            return [torch.zeros_like(w) if g is None else g for g, w in zip(got, wrt, strict=True)]

        with buffers_kept(self.model):  # two extra passes: BN statistics stay untouched
            checkpointed = grads()
            with plain_backward():
                plain = grads()
        self.max_diff = max(
            (
                float((a - b).abs().max())
                for a, b in zip(checkpointed, plain, strict=True)
                if a.numel()
            ),
            default=0.0,
        )
        scale = max((float(b.abs().max()) for b in plain if b.numel()), default=0.0)
        self.tolerance = CHECK_ATOL + CHECK_RTOL * scale
        log.info(
            "gradient_checkpoint.check_gradients: max |checkpointed - plain| gradient = %.3g "
            "(tolerance %.3g)",
            self.max_diff,
            self.tolerance,
        )
        if not self.max_diff <= self.tolerance:  # NaN fails too
            raise ConfigError(
                "gradient_checkpoint.check_gradients: the checkpointed model's gradients differ "
                f"from a plain backward's: max difference {self.max_diff:.3g} > tolerance "
                f"{self.tolerance:.3g} ({CHECK_ATOL:g} + {CHECK_RTOL:g} x the largest gradient "
                f"{scale:.3g}); no step was taken. A checkpointed block is run again in backward "
                "and must compute the same values: make its forward depend only on its inputs "
                "and parameters (no state that changes per call; randomness through torch's "
                "RNG), or leave it out of gradient_checkpoint (type / end_taskgraph / "
                "persia.epl.add_to_collection)"
            )
