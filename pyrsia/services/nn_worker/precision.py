"""Mixed precision for the dense model: fp16 autocast + GradScaler on CUDA, bf16 on CPU.

On a GPU, ``mixed_precision=True`` runs the forward pass under fp16 autocast and
scales the loss with a ``GradScaler`` (PERSIA's behaviour). On a machine without CUDA
PERSIA refused with an assertion; here the forward pass runs under bf16 autocast on
the CPU instead (bf16 has fp32's range, so no loss scaling is needed) and a note is
logged once.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import platform

import torch

from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import positive_int

log = logging.getLogger(__name__)


@functools.cache
def cpu_computes_bf16() -> bool | None:
    """Whether this CPU has bf16 instructions (AVX-512 BF16 or AMX); None where unknown.

    Without them oneDNN emulates bf16 and autocast runs slower than fp32 (about 20x for
    the e2e DLRM on an AVX-512 EPYC without BF16); with them the step runs 1.8-2.2x
    faster. Only x86 can be asked; other architectures answer None.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return None
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def autocast_target(cuda: bool, owner: str) -> tuple[str, torch.dtype]:
    """Where and in what ``owner``'s autocast runs: fp16 on CUDA, bf16 on the CPU.

    On a CPU that emulates bf16 a warning says so (the step runs many times slower than fp32).
    """
    if cuda:
        return "cuda", torch.float16
    if cpu_computes_bf16() is False:
        log.warning(
            "%s runs the forward pass under bf16 autocast, but this CPU has no bf16 "
            "instructions (AVX-512 BF16 or AMX): the step runs many times slower than fp32 "
            "(pass mixed_precision=False / drop amp.level for full fp32)",
            owner,
        )
    return "cpu", torch.bfloat16


class Precision:
    """The autocast context and the optional loss scaler of one training context."""

    def __init__(self, mixed_precision: bool, device_id: int | None):
        self.enabled = bool(mixed_precision)
        self.cuda = device_id is not None and torch.cuda.is_available()
        self.scaler: torch.amp.GradScaler | None = None
        if not self.enabled:
            self.device_type, self.dtype = ("cuda" if self.cuda else "cpu"), None
            return
        self.device_type, self.dtype = autocast_target(self.cuda, "mixed_precision=True")
        if self.cuda:
            self.scaler = torch.amp.GradScaler("cuda")
        else:
            log.info(
                "mixed_precision=True without CUDA: the forward pass runs under bf16 autocast "
                "on the CPU, without loss scaling (pass mixed_precision=False for full fp32)"
            )

    def autocast(self) -> contextlib.AbstractContextManager:
        """The autocast region for the model's forward pass (a no-op when disabled)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    @staticmethod
    def to_full(output):
        """Low-precision floating outputs back to float32, so losses compute in fp32."""
        if isinstance(output, torch.Tensor):
            if output.dtype in (torch.float16, torch.bfloat16):
                return output.float()
            return output
        if isinstance(output, (tuple, list)):
            return type(output)(Precision.to_full(o) for o in output)
        return output

    def scale(self, loss: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The loss to call ``backward`` on and the scale it carries (1.0 without a scaler)."""
        if self.scaler is None:
            return loss, 1.0
        return self.scaler.scale(loss), float(self.scaler.get_scale())

    def step(self, optimizer: torch.optim.Optimizer, finite: bool, shrink_factor: float) -> None:
        """Step the dense optimizer; on non-finite embedding gradients shrink the scale."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        if finite:
            self.scaler.update()
        else:  # the scale is read only here: on a GPU, get_scale() waits for the device
            self.scaler.update(float(self.scaler.get_scale()) / shrink_factor)


def check_ctx_args(threadpool_worker_size, device_id) -> tuple[int, int | None]:
    """Validate a context's ``threadpool_worker_size`` and ``device_id`` (a usable CUDA index)."""
    threadpool_worker_size = positive_int(threadpool_worker_size, "threadpool_worker_size")
    if device_id is not None:
        if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
            raise InvalidInputError("device_id", "None or a CUDA device index >= 0", device_id)
        if not torch.cuda.is_available() or device_id >= torch.cuda.device_count():
            raise InvalidInputError(
                "device_id",
                f"a CUDA device index below {torch.cuda.device_count()} "
                "(pass device_id=None to train on the CPU)",
                device_id,
            )
    return threadpool_worker_size, device_id
