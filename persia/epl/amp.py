"""``amp.*``: autocast + loss scaling for the dense model (EPL's O1 mixed precision).

- ``amp.level = "O1"``: the forward pass runs under autocast, fp16 on CUDA and bf16 on
  the CPU (EPL is GPU-only; bf16 is what a CPU computes fast).
- ``amp.loss_scale``: ``"dynamic"`` is torch's ``GradScaler`` (grows, backs off on
  overflow); a number is a :class:`FixedLossScaler` whose scale never changes. On the
  CPU a dynamic scale is not used (bf16 has fp32's range), a fixed one is applied.
- ``amp.debug_log``: each step logs the loss scale and whether the step was skipped.

EPL keeps no fp16 copy of the weights (autocast casts them per use), which is also how
torch autocast works.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from persia.epl.config import Config
from pyrsia.services.nn_worker.precision import Precision, autocast_target

log = logging.getLogger(__name__)


class FixedLossScaler(torch.amp.GradScaler):
    """A ``GradScaler`` whose scale stays ``scale``: steps with inf/NaN are skipped, no backoff."""

    def __init__(self, device: str, scale: float):
        super().__init__(device, init_scale=float(scale))
        self.fixed_scale = float(scale)

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """End the step; the scale is put back to the fixed value whatever was asked."""
        super().update(self.fixed_scale)


class EplPrecision(Precision):
    """TrainCtx's precision under ``amp.*`` (and the step's gradient clipping hook)."""

    def __init__(
        self,
        config: Config,
        device_id: int | None,
        fallback: Precision,
        clip: Callable[[torch.optim.Optimizer], None] | None = None,
        clip_active: Callable[[], bool] | None = None,
    ):
        """``clip(optimizer)`` runs on the unscaled gradients of the steps where
        ``clip_active()`` is true (default: every step when ``clip`` is given)."""
        self.debug = bool(config.amp.debug_log)
        self.clip = clip
        self.clip_active = clip_active or (lambda: self.clip is not None)
        self.steps = 0
        if config.amp.level != "O1":
            # amp off: keep TrainCtx's own mixed_precision behaviour
            self.__dict__.update(fallback.__dict__)
            return
        self.enabled = True
        self.cuda = fallback.cuda
        loss_scale = config.amp.loss_scale
        self.device_type, self.dtype = autocast_target(self.cuda, "amp.level O1")
        if loss_scale != "dynamic":
            self.scaler = FixedLossScaler(self.device_type, loss_scale)
        elif self.cuda:
            self.scaler = torch.amp.GradScaler("cuda")
        else:
            self.scaler = None
            log.info("amp.level O1 on the CPU: bf16 autocast; dynamic loss scaling not needed")
        log.info("amp.level O1: %s autocast, loss scale %s", self.dtype, loss_scale)

    def step(self, optimizer: torch.optim.Optimizer, finite: bool, shrink_factor: float) -> None:
        """Unscale, clip (``communication.clip_after_allreduce``), step, update the scale."""
        self.steps += 1
        clip = self.clip is not None and self.clip_active()
        if self.scaler is None:
            if clip:
                self.clip(optimizer)
            optimizer.step()
            if self.debug:
                log.info("amp debug: step %d, no loss scaling (%s)", self.steps, self.dtype)
            return
        # the scale and the found-inf flags are read only where needed: on a GPU each read
        # waits for the device
        scale = float(self.scaler.get_scale()) if self.debug or not finite else 0.0
        if clip:
            self.scaler.unscale_(optimizer)
            self.clip(optimizer)
        self.scaler.step(optimizer)
        skipped = False  # read before update(), which forgets it
        if self.debug:
            found = self.scaler._found_inf_per_device(optimizer).values()
            skipped = sum(float(v.sum()) for v in found) > 0
        if finite:
            self.scaler.update()
        else:
            self.scaler.update(scale / shrink_factor)
        if self.debug:
            log.info(
                "amp debug: step %d, loss scale %g -> %g, dense step %s, embedding grads %s",
                self.steps,
                scale,
                float(self.scaler.get_scale()),
                "skipped (inf/NaN)" if skipped else "applied",
                "finite" if finite else "non-finite",
            )
