"""The training step as an object: what ``TrainCtx.backward(loss)`` runs, and its hooks.

One step, and where its five hook points fire::

    ctx.forward(batch) / ctx.prepare_features(batch)
      └─ before_forward      the batch is known; the model has not run
    ctx.backward(loss)  =  TrainingStep.run(loss, batch, embeddings, optimizer)
      scale the loss (precision) ── autograd
      └─ after_backward      dense and embedding gradients computed (still scaled)
      every `check_frequency` steps: are the embedding gradients finite? (ranks agree)
      embedding gradients ──> BackwardEngine (asynchronous; not on a shadow step; on the
                              CPU held until the next backward starts, or the loop waits)
      └─ before_dense_step   the dense gradients are final (DDP all-reduced)
      precision.step(optimizer) (through the loss scaler when there is one); zero_grad
      └─ after_dense_step    the dense parameters moved
      └─ step_boundary       the step is counted: periodic checkpoint, /metrics, curves

A hook is ``fn(event: StepEvent) -> None``, added with :meth:`TrainingStep.add_hook`
(``ctx.training_step.add_hook("after_backward", fn)``); hooks of one point run in the
order they were added, on the training thread, and an exception from one ends the step
there (as an exception in the training loop would). ``add_hook`` returns a handle whose
``remove()`` takes the hook away. Pyrsia's own extensions plug in the same way:
``TrainCtx`` adds the periodic checkpointer and the rank's statistics at
``step_boundary`` when it is entered, EPL provides the precision the step is built with
(``persia._train_parts``), and the even-steps agreement runs its zero-gradient steps inside :meth:`TrainingStep.shadow`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from pyrsia.services.nn_worker.backward import BackwardEngine
from pyrsia.services.nn_worker.batch import PersiaTrainingBatch
from pyrsia.services.nn_worker.features import gradient_payload, nonfinite_slots
from pyrsia.services.nn_worker.precision import Precision
from pyrsia.services.nn_worker.step_clock import StepClock
from pyrsia.services.nn_worker.termination import TerminationGuard
from pyrsia.shared.errors import InvalidInputError

log = logging.getLogger("persia.ctx")

HOOK_POINTS = (
    "before_forward",
    "after_backward",
    "before_dense_step",
    "after_dense_step",
    "step_boundary",
)
"""Where a hook can run, in the order a step reaches them."""


@dataclass
class StepEvent:
    """What a hook is told about the step under way.

    ``step`` is the step's number (1 for the first step; after ``--resume``, the restored
    count + 1). ``loss`` is the user's (unscaled) loss and ``scale`` the loss scale it
    was multiplied by for backward (1.0 without a scaler); both are unset before
    backward. ``finite`` is False when this step's embedding update was skipped (NaN or
    inf found). ``shadow`` is True on a zero-gradient step that keeps ranks in lockstep
    (``even_steps``): no embedding update, not a trained batch.
    """

    step: int
    batch: PersiaTrainingBatch
    shadow: bool = False
    loss: torch.Tensor | None = None
    scale: float = 1.0
    finite: bool = True
    optimizer: torch.optim.Optimizer | None = None


Hook = Callable[[StepEvent], Any]


class HookHandle:
    """Returned by :meth:`TrainingStep.add_hook`; ``remove()`` takes the hook away (once)."""

    def __init__(self, hooks: list[Hook], hook: Hook):
        self._hooks = hooks
        self._hook = hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


class TrainingStep:
    """One synchronous training step with public hook points (see the module docstring).

    Arguments:
        precision: autocast, loss scaling and the dense optimizer step
            (:class:`~pyrsia.services.nn_worker.precision.Precision`); with EPL's
            ``amp.*`` the one EPL returns.
        grad_scalar_update_factor: the loss scale is divided by this when embedding
            gradients are not finite.

    The owner attaches the gradient sender with :meth:`start` once connected, and sets
    :attr:`world_size` and :attr:`embedding_grad_divisor` (what the embedding worker
    divides this rank's gradients by besides the loss scale).
    """

    def __init__(self, precision: Precision, *, grad_scalar_update_factor: float):
        self.precision = precision
        """Autocast, loss scale and the optimizer step (EPL's under ``amp.*``)."""
        self.grad_scalar_update_factor = grad_scalar_update_factor
        self.steps = 0
        """Steps taken (``TrainCtx.update_times``)."""
        self.check_frequency = 20
        """The last ``embedding_gradient_check_frequency`` given to :meth:`run`."""
        self.world_size = 1
        self.embedding_grad_divisor = 1.0
        self.clock = StepClock()
        """Wall and CPU seconds per phase (autograd, gradient_send, dense_step)."""
        self.termination = TerminationGuard()
        """SIGTERM while the context is entered (``termination.triggered``)."""
        self.gradients: BackwardEngine | None = None
        self._hooks: dict[str, list[Hook]] = {point: [] for point in HOOK_POINTS}
        self._shadowing = False

    # --- hooks --------------------------------------------------------------------------
    def add_hook(self, point: str, hook: Hook) -> HookHandle:
        """Run ``hook(event)`` at ``point`` (one of :data:`HOOK_POINTS`) of every step."""
        if point not in self._hooks:
            raise InvalidInputError("point", "one of " + ", ".join(HOOK_POINTS), point)
        if not callable(hook):
            raise InvalidInputError("hook", "a callable taking a StepEvent", hook)
        hooks = self._hooks[point]
        hooks.append(hook)
        return HookHandle(hooks, hook)

    def hooks(self, point: str) -> Sequence[Hook]:
        """The hooks of ``point``, in the order they run."""
        return tuple(self._hooks[point])

    def _fire(self, point: str, event: StepEvent) -> None:
        for hook in self._hooks[point]:
            hook(event)

    # --- lifecycle ----------------------------------------------------------------------
    def start(self, gradients: BackwardEngine) -> None:
        """Attach the gradient sender (the context is entered and connected)."""
        self.gradients = gradients

    def stop(self) -> BackwardEngine | None:
        """Detach and return the gradient sender (the owner flushes it)."""
        gradients, self.gradients = self.gradients, None
        return gradients

    def hand_over(self) -> None:
        """Give the loop the embedding gradients held since the last step (the training
        loop calls it before it waits for the loop's work: the next batch)."""
        if self.gradients is not None:
            self.gradients.hand_over()

    @property
    def shadowing(self) -> bool:
        """Whether a shadow step (zero gradients, no embedding update) is running."""
        return self._shadowing

    @contextlib.contextmanager
    def shadow(self) -> Iterator[None]:
        """Steps inside take part in the ranks' collectives but update no embedding and
        are not trained batches (``even_steps``)."""
        self._shadowing = True
        try:
            yield
        finally:
            self._shadowing = False

    # --- the step -----------------------------------------------------------------------
    def before_forward(self, batch: PersiaTrainingBatch) -> None:
        """Fire ``before_forward`` for ``batch`` (the context calls it as features are made)."""
        if self._hooks["before_forward"]:
            self._fire("before_forward", StepEvent(self.steps + 1, batch, self._shadowing))

    def run(
        self,
        loss: torch.Tensor,
        batch: PersiaTrainingBatch,
        embeddings: list[tuple[str, torch.Tensor]],
        optimizer: torch.optim.Optimizer,
        check_frequency: int,
    ) -> torch.Tensor:
        """Backward, embedding gradients out, dense step; the loss as scaled for backward."""
        gradients = self.gradients
        assert gradients is not None, "TrainingStep.run before start()"
        self.check_frequency = check_frequency
        gradients.raise_pending()
        clock = self.clock
        clock.start()
        event = StepEvent(self.steps + 1, batch, self._shadowing, loss, optimizer=optimizer)
        scaled, event.scale = self.precision.scale(loss)
        gradients.hand_over()  # the last step's: the loop works on them while autograd runs
        scaled.backward()
        clock.lap("autograd")
        self._fire("after_backward", event)
        bad: list[str] = []
        if self.steps % check_frequency == 0:  # PERSIA checked only on the first step
            bad = nonfinite_slots(embeddings)
            event.finite = self._agree(not bad)
        self.steps += 1
        self._send_embedding_gradients(event, embeddings, bad)
        clock.lap("gradient_send")
        self._fire("before_dense_step", event)
        self.precision.step(optimizer, event.finite, self.grad_scalar_update_factor)
        optimizer.zero_grad(set_to_none=True)
        clock.lap("dense_step")
        self._fire("after_dense_step", event)
        self._fire("step_boundary", event)
        return scaled

    def _send_embedding_gradients(
        self, event: StepEvent, embeddings: list[tuple[str, torch.Tensor]], bad: list[str]
    ) -> None:
        batch = event.batch
        grads = partial(gradient_payload, embeddings, batch.tables)  # the sender runs it
        if not event.finite:
            log.warning(
                "NaN or inf in the embedding gradient of slot(s) %s (loss scale %g): embedding "
                "update of this batch skipped (labels and dense features were checked finite "
                "on arrival: look at the model's output and the loss)",
                bad or "none on this rank, another rank's",
                event.scale,
            )
            grads = list  # no gradients: the worker still releases the batch
        if event.shadow:  # a shadow step (even_steps.py) updates no embedding
            return
        assert self.gradients is not None
        # On the CPU the loop gets them as the next backward starts (backward.py says why);
        # on a GPU at once: their copy off the device would queue behind the next step.
        send = self.gradients.submit if self.precision.cuda else self.gradients.hold
        send(
            batch.worker,
            batch.batch_id,
            event.scale * self.embedding_grad_divisor,
            grads,
            on_done=batch.take_release(),
        )

    def _agree(self, finite: bool) -> bool:
        """All ranks take the same decision, so their loss scales stay equal."""
        if (
            self.world_size <= 1
            or not torch.distributed.is_initialized()
            or self.precision.scaler is None
        ):
            return finite
        device = "cuda" if self.precision.cuda else "cpu"
        flag = torch.tensor([1 if finite else 0], device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item())
