"""Every NN-worker rank takes the same number of synchronous steps, however the batches fall.

Data loaders send batch ``b`` to rank ``b mod world_size``, so an epoch of 255 batches over
2 ranks gives rank 0 one batch more than rank 1. DDP all-reduces the dense gradients in
every step; a rank left with a last batch that its peers do not have would wait in that
all-reduce forever (or fail when they exit). PyTorch's answer is ``Join``: a rank out of
inputs "shadows" the others' collectives with zero gradients until every rank is done.
A PERSIA ``train.py`` has no ``Join`` in it, and must run unchanged, so the training
``DataLoader`` over a :class:`~persia.data.StreamingDataset` does it:

- Before every step the ranks all-reduce ``[have a batch, cannot shadow, stopped]``
  (one 3-int all-reduce; the DDP step that follows is two orders of magnitude bigger).
- Every rank has a batch: each trains its own, as before.
- No rank has one: the stream is over on every rank, and every loop ends at the same step.
- Some ranks have one: the others take a **shadow step** without showing it to the
  training loop: forward and backward of their last batch with a zero loss, through the
  same ``ctx.forward`` / ``ctx.backward`` (so DDP's gradient all-reduce, the loss-scale
  agreement and the periodic-checkpoint decision run exactly as on the training ranks),
  then the same dense optimizer step on the same all-reduced gradients. Dense parameters
  and optimizer state stay identical on every rank. The shadow step sends no embedding
  gradient and is not recorded as a trained batch, so each batch's embedding gradients
  are applied exactly once. As with DDP's ``Join`` (``divide_by_initial_world_size=True``,
  its default), the gradient of a step that fewer ranks train is averaged over all ranks.
- A rank whose loop stops early (``break``, an exception) tells the others, in that same
  all-reduce, when its iterator is closed; they end their loops at that step too (logging
  the batches left untrained) instead of waiting in a collective for a rank that is gone.

A rank that never received a batch has nothing to shadow with (fewer batches than ranks);
then every rank raises the same :class:`~pyrsia.shared.errors.ConfigError`.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch

from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.step import TrainingStep
from pyrsia.shared.constants import RANK_STOP_NOTICE_TIMEOUT_S
from pyrsia.shared.errors import ConfigError


class StepHost(Protocol):
    """The training context a shadow step runs through: ``persia.ctx.TrainCtx`` is one."""

    rank_id: int
    world_size: int
    training_step: TrainingStep

    def forward(self, batch: PersiaTrainingBatch) -> tuple[Any, Any]: ...

    def backward(self, loss: torch.Tensor, embedding_gradient_check_frequency: int) -> Any: ...


log = logging.getLogger(__name__)

_HAVE, _CANNOT_SHADOW, _STOPPED = 0, 1, 2


def zero_loss(output: torch.Tensor | tuple | list) -> torch.Tensor:
    """A loss of 0 that depends on every output tensor (so every used parameter gets a zero gradient)."""
    outputs = [output] if isinstance(output, torch.Tensor) else list(output)
    total = sum(o.float().sum() for o in outputs if o.requires_grad)
    return total * 0.0


class EvenSteps:
    """Agrees, before each step, whether every rank trains, shadows, or stops (see module doc)."""

    def __init__(self, ctx: StepHost, fetch: Callable[[], PersiaTrainingBatch | None]):
        self.ctx = ctx
        self.fetch = fetch
        self.rank = ctx.rank_id
        self.world_size = ctx.world_size
        self.device = torch.device("cuda", torch.cuda.current_device()) if _nccl() else None
        self.template: PersiaTrainingBatch | None = None
        self.exhausted = False  # this rank's stream ended
        self.finished = False  # every rank agreed the loop is over
        self.shadow_steps = 0

    def next(self) -> PersiaTrainingBatch | None:
        """This rank's next batch, or None once every rank's loop ends (at the same step)."""
        while not self.finished:
            batch = None if self.exhausted else self.fetch()
            self.exhausted = batch is None
            counts = self._all_reduce(
                have=batch is not None, cannot_shadow=batch is None and self.template is None
            )
            if counts[_STOPPED] > 0:
                self._stop_with_peers(batch)
                return None
            if counts[_HAVE] == 0:
                self.finished = True
                if self.shadow_steps:
                    log.info(
                        "rank %d: %d shadow step(s) at the end of the stream (uneven batches)",
                        self.rank,
                        self.shadow_steps,
                    )
                return None
            if counts[_CANNOT_SHADOW] > 0:
                self.finished = True
                if batch is not None:
                    batch.release()
                raise ConfigError(
                    f"{counts[_CANNOT_SHADOW]} NN-worker rank(s) received no batch at all while "
                    f"{counts[_HAVE]} still had one: a rank with no batch cannot take part in the "
                    "other ranks' synchronous steps; send at least as many batches as there are "
                    "NN-worker ranks"
                )
            if batch is not None:
                self.template = batch
                return batch
            self._shadow_step()
        return None

    def close(self) -> None:
        """The training loop left early: tell the other ranks, so that they stop too."""
        if self.finished:
            return
        self.finished = True
        if self.ctx.training_step.termination.triggered:
            return  # SIGTERM: every rank is stopping; do not spend the drain time waiting
        try:
            self._all_reduce(
                have=False, cannot_shadow=False, stopped=True, timeout_s=RANK_STOP_NOTICE_TIMEOUT_S
            )
        except Exception as exc:  # the peers may be gone already; closing must not raise
            log.warning(
                "rank %d: could not tell the other ranks that its loop stopped: %s", self.rank, exc
            )

    # --- internals ----------------------------------------------------------------------
    def _all_reduce(
        self,
        *,
        have: bool,
        cannot_shadow: bool,
        stopped: bool = False,
        timeout_s: float | None = None,
    ) -> list[int]:
        flags = torch.tensor([int(have), int(cannot_shadow), int(stopped)], dtype=torch.int32)
        if self.device is not None:
            flags = flags.to(self.device)
        work = torch.distributed.all_reduce(flags, async_op=True)
        if timeout_s is None:
            work.wait()
        else:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        return [int(v) for v in flags.cpu().tolist()]

    def _shadow_step(self) -> None:
        """A step with zero gradients on this rank's last batch (no embedding update)."""
        assert self.template is not None
        ctx, step = self.ctx, self.ctx.training_step
        with step.shadow():
            output, _ = ctx.forward(self.template)
            ctx.backward(zero_loss(output), step.check_frequency)
        self.shadow_steps += 1

    def _stop_with_peers(self, batch: PersiaTrainingBatch | None) -> None:
        self.finished = True
        left = 0
        if batch is not None:
            batch.release()
            left = 1
        (log.warning if left else log.info)(
            "rank %d: another NN-worker rank's training loop stopped; this rank's loop ends at "
            "the same step%s",
            self.rank,
            " (its next batch is not trained)" if left else "",
        )


def _nccl() -> bool:
    return torch.distributed.get_backend() == "nccl"


def agreeing(world_size: int) -> bool:
    """Whether training batches on ``world_size`` ranks need the per-step agreement (>1 rank)."""
    return (
        world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()
    )
