"""``pipeline.num_micro_batch``: split each batch into N micro-batches, accumulate, step once.

PERSIA's API runs the whole batch's forward in ``ctx.forward`` and its backward in
``ctx.backward(loss)``, with the user's loss in between. To keep only one
micro-batch's activations alive at a time without seeing the loss function::

    ctx.forward:  for each micro-batch (no autograd): out_i = model(x_i)
                  output = cat(out_i)   ─> the user's loss
    ctx.backward: d loss / d output      (one autograd node for the whole model)
                  for each micro-batch:  out_i = model(x_i) again, with autograd,
                                         backward(d loss / d out_i)  -> grads accumulate
                  one optimizer step

Without layers that look across samples, the gradients are the whole batch's (exactly:
d loss / d output is split, not approximated), whatever the loss' reduction. The price is one extra forward pass
per micro-batch (EPL's own gradient accumulation runs the loss per micro-batch
instead). The RNG state of each micro-batch is replayed, so dropout masks match.
Under DDP the gradients are all-reduced once, with the last micro-batch (``no_sync``).
Layers that look across samples (BatchNorm) see micro-batches, as in EPL, where each
micro-batch is one ``session.run`` of the model (``epl/runtime/gradient_accumulation.py``):
each micro-batch passes through the model in training mode once per step, so BatchNorm's
running statistics and ``num_batches_tracked`` move once per micro-batch (N times per
batch), computed on the micro-batch; the re-run in backward restores every buffer it
writes (:func:`persia.epl.buffers.buffers_kept`). Normalizing with a micro-batch's statistics
also makes the gradients differ from the whole batch's, so the first micro-batched step of a
model with BatchNorm logs one warning naming its BatchNorm modules.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
from torch import nn

from persia.epl.buffers import buffers_kept
from pyrsia.shared.errors import InvalidInputError

log = logging.getLogger(__name__)


def batchnorm_names(model: nn.Module) -> list[str]:
    """The dotted names of ``model``'s BatchNorm modules (any ``_BatchNorm``: 1d/2d/3d, lazy,
    ``SyncBatchNorm``)."""
    return [
        name or type(model).__name__
        for name, m in model.named_modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]


def _autocast_state() -> list[tuple[str, bool, torch.dtype]]:
    return [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in ("cpu", "cuda")]


def _autocast(state) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for device, enabled, dtype in state:
        if enabled:
            stack.enter_context(torch.autocast(device_type=device, dtype=dtype))
    return stack


class _RngState:
    """The CPU (and current CUDA device's) generator state before one micro-batch."""

    def __init__(self):
        self.cpu = torch.get_rng_state()
        self.cuda = torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None

    @contextlib.contextmanager
    def replay(self):
        devices = [torch.cuda.current_device()] if self.cuda is not None else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu)
            if self.cuda is not None:
                torch.cuda.set_rng_state(self.cuda)
            yield


class _MicroBatches(torch.autograd.Function):
    """Forward without autograd per micro-batch; backward re-runs each with autograd."""

    @staticmethod
    def forward(
        fn_ctx, owner: EplModel, n_non_id: int, _anchor: torch.Tensor, *inputs: torch.Tensor
    ):
        batch = inputs[0].shape[0]
        n = max(1, min(owner.num_micro_batch, batch))
        bounds = [
            (int(c[0]), int(c[-1]) + 1) for c in torch.arange(batch).tensor_split(n) if len(c)
        ]
        outputs, rng = [], []
        for lo, hi in bounds:
            rng.append(_RngState())
            chunk = [x[lo:hi] for x in inputs]
            outputs.append(owner.runner(chunk[:n_non_id], chunk[n_non_id:]))
        fn_ctx.owner, fn_ctx.n_non_id, fn_ctx.bounds, fn_ctx.rng = owner, n_non_id, bounds, rng
        fn_ctx.autocast = _autocast_state()
        fn_ctx.save_for_backward(*inputs)
        fn_ctx.is_tuple = not isinstance(outputs[0], torch.Tensor)
        if fn_ctx.is_tuple:
            return tuple(torch.cat(parts) for parts in zip(*outputs, strict=True))
        return torch.cat(outputs)

    @staticmethod
    def backward(fn_ctx, *grad_outputs: torch.Tensor):
        owner, n_non_id = fn_ctx.owner, fn_ctx.n_non_id
        inputs = [
            x.detach().requires_grad_(x.requires_grad and x.is_floating_point())
            for x in fn_ctx.saved_tensors
        ]
        runner = owner.runner
        last = len(fn_ctx.bounds) - 1
        for i, ((lo, hi), rng) in enumerate(zip(fn_ctx.bounds, fn_ctx.rng, strict=True)):
            sync = contextlib.nullcontext()
            if i < last and hasattr(runner, "no_sync"):
                sync = runner.no_sync()  # DDP all-reduces once, with the last micro-batch
            # the re-run is the second pass of these samples: BN statistics stay as the
            # no-autograd pass left them (each sample updates them once per step)
            with sync, rng.replay(), torch.enable_grad(), buffers_kept(owner.module):
                chunk = [x[lo:hi] for x in inputs]
                with _autocast(fn_ctx.autocast):
                    out = runner(chunk[:n_non_id], chunk[n_non_id:])
                outs = [out] if isinstance(out, torch.Tensor) else list(out)
                pairs = [
                    (o, g[lo:hi])
                    for o, g in zip(outs, grad_outputs, strict=True)
                    if g is not None and o.requires_grad
                ]
                if pairs:
                    torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        grads = [x.grad if x.requires_grad else None for x in inputs]
        return (None, None, None, *grads)


class EplModel(nn.Module):
    """``TrainCtx.model`` under EPL: micro-batching and the one-time gradient check.

    ``runner`` is the user's model (DDP-wrapped once the process group exists);
    ``module`` is always the user's model, so checkpoints save its plain state dict.
    """

    def __init__(
        self,
        model: nn.Module,
        num_micro_batch: int,
        first_step_check: Callable[[list[torch.Tensor], list[torch.Tensor]], None] | None = None,
    ):
        super().__init__()
        self.runner = model
        self._user_model = [model]  # a list: not registered twice as a submodule
        self.num_micro_batch = num_micro_batch
        self._first_step_check = first_step_check
        self._batchnorm_noted = False

    @property
    def module(self) -> nn.Module:
        return self._user_model[0]

    def run_with(self, runner: nn.Module) -> None:
        """Run the user's model through ``runner`` from now on (its DDP wrapper, set by the
        plan once the process group exists)."""
        self.runner = runner

    def _note_batchnorm(self) -> None:
        """Once, on the first micro-batched step: BatchNorm makes the gradients differ."""
        names = batchnorm_names(self.module)
        if names:
            log.warning(
                "pipeline.num_micro_batch=%d with BatchNorm (%s): each micro-batch is normalized "
                "with its own mean and variance, so the gradients are not the whole batch's, "
                "and the running statistics move once per micro-batch (as in EPL). Use "
                "pipeline.num_micro_batch=1, or GroupNorm/LayerNorm, for whole-batch gradients",
                self.num_micro_batch,
                ", ".join(names),
            )

    def forward(self, non_id: list[torch.Tensor], embeddings: list[torch.Tensor]):
        training = self.training and torch.is_grad_enabled()
        if training and self._first_step_check is not None:
            check, self._first_step_check = self._first_step_check, None
            check(list(non_id), list(embeddings))
        if not training or self.num_micro_batch == 1:
            return self.runner(non_id, embeddings)
        if not self._batchnorm_noted:
            self._batchnorm_noted = True
            self._note_batchnorm()
        inputs = [*non_id, *embeddings]
        if not inputs:
            raise InvalidInputError(
                "inputs",
                "at least one input tensor to split",
                message="pipeline.num_micro_batch > 1 needs at least one input tensor to split",
            )
        # the anchor makes the output require grad even when no input does (only parameters)
        anchor = torch.empty(0, requires_grad=True)
        return _MicroBatches.apply(self, len(non_id), anchor, *inputs)
