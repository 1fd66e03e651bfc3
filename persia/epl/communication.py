"""``communication.*``: how DDP all-reduces the dense gradients.

- ``max_splits``: the gradients are fused into at most about that many buckets
  (``bucket_cap_mb`` = the model's gradient size / ``max_splits``).
- ``num_communicators``: a pool of that many process groups; bucket ``k`` is reduced on
  group ``k mod num_communicators``, so buckets can be in flight on different
  communicators (EPL's communication pool).
- ``fp16`` / ``fp16_scale``: buckets travel as fp16; they are multiplied by ``fp16_scale``
  before the cast and divided after the reduction, so small gradients do not underflow.
- ``gradients_reduce_method``: ``mean`` (DDP's default) or ``sum`` (no division by the
  number of ranks).
- ``sparse_as_dense``: ``nn.Embedding(sparse=True)`` / ``EmbeddingBag`` layers of the
  dense model produce dense gradients, so they are bucketed and all-reduced like the rest.
- ``clip_after_allreduce``: where :func:`persia.epl.clip_by_global_norm` clips. True: the
  all-reduced gradients; False (EPL's default): each rank's local gradients, then the
  reduction runs at the optimizer step (the DDP hook hands back the local bucket).
  The hook asks at every bucket whether a norm is registered, so a norm registered (or
  removed) after the TrainCtx was built applies from the next backward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from persia.epl.config import Config

log = logging.getLogger(__name__)


def bucket_cap_mb(model: nn.Module, max_splits: int) -> float:
    """The DDP bucket size that splits ``model``'s gradients into ``max_splits`` buckets."""
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return max(total / max_splits / 2**20, 1e-6)


def densify_sparse_layers(model: nn.Module) -> int:
    """``sparse_as_dense``: embedding layers with sparse gradients switch to dense ones."""
    switched = 0
    for module in model.modules():
        if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and module.sparse:
            module.sparse = False
            switched += 1
    if switched:
        log.info(
            "communication.sparse_as_dense: %d embedding layers now give dense gradients", switched
        )
    return switched


@dataclass
class ReduceState:
    """What the DDP communication hook needs (and counts, for tests and logs)."""

    groups: list
    world_size: int
    mean: bool
    fp16: bool
    fp16_scale: float
    should_defer: Callable[[], bool] = lambda: False  # asked per bucket: clip locally first?
    deferred: bool = False  # this step's buckets were handed back unreduced (reduce_now owes them)
    buckets_seen: int = 0
    groups_used: set = field(default_factory=set)

    @classmethod
    def from_config(
        cls, config: Config, world_size: int, should_defer: Callable[[], bool]
    ) -> ReduceState:
        comm = config.communication
        everyone = list(range(world_size))
        groups = [dist.new_group(ranks=everyone) for _ in range(comm.num_communicators)]
        return cls(
            groups,
            world_size,
            comm.gradients_reduce_method == "mean",
            comm.fp16,
            float(comm.fp16_scale),
            should_defer,
        )

    def reduce_async(self, tensor: torch.Tensor, index: int) -> torch.futures.Future:
        """All-reduce ``tensor`` in place on communicator ``index mod n``."""
        group = self.groups[index % len(self.groups)]
        self.groups_used.add(index % len(self.groups))
        divisor = self.world_size if self.mean else 1
        if self.fp16:
            send = (tensor * (self.fp16_scale / divisor)).to(torch.float16)
        else:
            send = tensor.div_(divisor) if divisor > 1 else tensor
        fut = dist.all_reduce(send, group=group, async_op=True).get_future()

        def finish(done: torch.futures.Future) -> torch.Tensor:
            if self.fp16:
                tensor.copy_(done.value()[0].to(tensor.dtype).div_(self.fp16_scale))
            return tensor

        return fut.then(finish)

    def reduce_now(self, params: list[torch.Tensor]) -> None:
        """Deferred mode: all-reduce the (clipped) local gradients before the step."""
        self.deferred = False
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.reduce_async(flat, 0).wait()
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()


def reduce_hook(state: ReduceState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: mean/sum, fp16, communicator pool; or hand back local grads."""
    state.buckets_seen += 1
    if state.should_defer():
        state.deferred = True
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    return state.reduce_async(bucket.buffer(), bucket.index())


# DDP checks the hook's annotations as objects; this module's are strings (PEP 563)
reduce_hook.__annotations__ = {
    "state": ReduceState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def clip_by_norm(params: list[torch.Tensor], max_norm: float) -> float:
    """Clip the gradients of ``params`` to global L2 norm ``max_norm``; the norm before."""
    grads = [p for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.nn.utils.clip_grad_norm_(grads, max_norm))
