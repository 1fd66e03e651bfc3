"""How ``hb.metrics`` combines the ranks: whether to, on which device, and gathering arrays.

A metric's ``result()`` is a collective call. With several ranks (``WORLD_SIZE > 1``) the
process group is joined here if no one did before, so a metric never returns a rank-local
value by mistake; NCCL groups exchange CUDA tensors, others CPU tensors.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from persia.hb._context import context

__all__ = ["all_gather_1d", "device", "distributed"]


def distributed() -> bool:
    """True when the ranks must be combined (joins the process group when there is none)."""
    if context.world_size > 1:
        context.init_process_group()
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def device() -> torch.device:
    """Where collective tensors live: the current CUDA device under NCCL, else the CPU."""
    if distributed() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_gather_1d(array: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Concatenation of every rank's 1-D array (sizes exchanged first, then padded)."""
    here = device()
    local = torch.as_tensor(array, dtype=dtype, device=here)
    size = torch.tensor([local.numel()], dtype=torch.int64, device=here)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(s.item()) for s in sizes)
    padded = torch.zeros(longest, dtype=dtype, device=here)
    padded[: local.numel()] = local
    gathered = [torch.zeros_like(padded) for _ in sizes]
    dist.all_gather(gathered, padded)
    return torch.cat(
        [g[: int(s.item())].cpu() for g, s in zip(gathered, sizes, strict=True)]
    ).numpy()
