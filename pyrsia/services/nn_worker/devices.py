"""How many GPUs this node shows its processes: one NN-worker rank per visible GPU.

Read, in this order (the first variable that is set wins, as HybridBackend does):

- ``CUDA_VISIBLE_DEVICES``: what CUDA will enumerate in the process;
- ``NVIDIA_VISIBLE_DEVICES``: what the NVIDIA container runtime mounted.

Values: a comma list of indices or UUIDs (``0,1``, ``GPU-6f2d...``, ``MIG-...``) counts
its entries (CUDA stops at the first negative index: ``0,-1,2`` is one GPU);
``all`` counts the GPUs torch sees; an empty value, ``none``, ``void`` or ``NoDevFiles``
means no GPU. With neither variable set, the GPUs torch sees are counted. Any other
value is a :class:`~pyrsia.shared.errors.ConfigError` naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyrsia.shared.errors import ConfigError

VISIBLE_DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")
_NO_DEVICE = ("", "none", "void", "nodevfiles")


def _torch_gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def count_visible(value: str, variable: str) -> int | None:
    """GPUs named by one variable's value; None for ``all`` (ask the driver)."""
    text = value.strip()
    if text.lower() in _NO_DEVICE:
        return 0
    if text.lower() == "all":
        return None
    count = 0
    for entry in (e.strip() for e in text.split(",")):
        if entry.lstrip("-").isdigit():
            if int(entry) < 0:
                break  # CUDA ignores this entry and every one after it
            count += 1
        elif entry.upper().startswith(("GPU-", "MIG-")):
            count += 1
        else:
            raise ConfigError(
                f"environment variable {variable}: expected a comma list of GPU indices or "
                f"UUIDs, 'all' or 'none', got {value!r}"
            )
    return count


def visible_gpu_count(environ: Mapping[str, str]) -> int:
    """Number of GPUs visible to processes started with ``environ`` (0 on a CPU-only
    machine)."""
    env = environ
    for variable in VISIBLE_DEVICE_VARIABLES:
        if variable in env:
            count = count_visible(env[variable], variable)
            return _torch_gpu_count() if count is None else count
    return _torch_gpu_count()
