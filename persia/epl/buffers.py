"""Module buffers kept as they were across a recomputation (BatchNorm statistics).

Micro-batching re-runs each micro-batch with autograd, gradient checkpointing re-runs
its blocks in backward, and ``check_gradients`` runs the model twice more: each of
those is a second pass of the same samples, so a layer that updates a buffer in
training mode (BatchNorm's ``running_mean``, ``running_var``, ``num_batches_tracked``)
would count the samples twice. :func:`buffers_kept` puts back every buffer such a pass
wrote, so each sample updates the statistics exactly once per step, as without these
options. The recomputation itself still uses the batch statistics (training mode), so
its outputs and gradients are those of the first pass. Cost: one copy of the module's
buffers per re-run (a few vectors per BatchNorm layer; nothing for a model without
buffers).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def buffers_kept(module: nn.Module) -> Iterator[None]:
    """Restore, on exit, every buffer of ``module`` written inside the block.

    Only buffers whose value changed are copied back: a buffer that was only read is
    left alone (no in-place write, so autograd's saved references to it stay valid).
    BatchNorm's kernel writes its running statistics without moving their version
    counter, so values, not versions, are compared.
    """
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                if not torch.equal(buffer, value):
                    buffer.copy_(value)
