"""Data parallelism of the dense model: rank 0's start, averaged gradients, ``grad_nbuckets``.

HybridBackend makes every dense variable made under ``hb.scope`` data parallel: its
initial value is rank 0's (``HybridBackendOptimizerHook`` broadcasts the replicated
variables' initializers) and its gradient is the mean over the ranks
(``GradientAggregation``: a sum all-reduce times ``1 / world_size``), in
``grad_nbuckets`` buckets (hybridbackend/tensorflow/training/optimizer.py and
optimizer_lib.py). Here, for torch:

- **rank 0's start**: :func:`broadcast_from_rank0` copies rank 0's parameters and
  buffers to every rank (after checking that every rank has the same tensors), when
  the outermost ``hb.scope`` made them, when :func:`data_parallel` returns a model
  without DDP (``grad_lazy_sync``), and when ``hb.wraps`` makes an optimizer (its
  parameters that no DDP model covers). DDP does the same for the models it wraps.
- **mean gradients**, in one of two places, both cut into ``grad_nbuckets`` buckets:
  during backward (default): :func:`data_parallel` wraps the model in torch's
  ``DistributedDataParallel`` with ``bucket_cap_mb_list`` from :func:`bucket_caps_mb`,
  so each bucket's all-reduce overlaps the rest of backward; or in
  ``optimizer.step()`` (``grad_lazy_sync=True``, a parameter made under ``hb.scope``
  that no DDP model covers, or one an ``hb.wraps`` optimizer steps):
  :func:`allreduce_gradients` averages the gradients in flat buckets. A parameter made
  under ``hb.scope`` is averaged before ``step()`` of *any* torch optimizer (a global
  step pre-hook), so ``torch.optim.SGD`` made in the scope trains correctly as it
  does in HybridBackend, where ``hb.scope`` rewrites the optimizers made in it.

``grad_nbuckets=n`` gives ``n`` all-reduces per step (``min(n, parameters)``) in both
places. With DDP that holds at the first step (DDP's buckets in registration order) and
after DDP's one rebuild (in the order backward produced the gradients, without
``find_unused_parameters``) when that order is the reverse of registration, i.e. when
``forward`` uses the layers in the order ``__init__`` declares them; a model that
declares them in another order may get another count after the first step (a warning
names it; the gradients are averaged all the same). Parameters of several dtypes are cut per dtype,
as DDP does.

A model wrapped in the user's own ``DistributedDataParallel`` (not ``hb.wraps``) and
made under ``hb.scope`` has its gradients averaged twice: the ranks' gradients are
already equal, so only time is lost (and, with a world size that is not a power of
two, a rounding); use ``hb.wraps(model)`` instead.
"""

from __future__ import annotations

import logging
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.optim.optimizer import register_optimizer_step_pre_hook

from persia.hb._context import context
from pyrsia.shared.errors import ConfigError, InvalidTypeError

log = logging.getLogger(__name__)

_MB = 1024 * 1024
_REDUCED_BY_DDP: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
"""id -> parameter, for the parameters a DDP model made here reduces (tensors compare by value,
so a WeakSet cannot hold them)."""


def bucket_partition(sizes: list[int], nbuckets: int) -> list[int]:
    """Lengths of ``min(nbuckets, len(sizes))`` contiguous runs of ``sizes`` of near-equal sums."""
    n = len(sizes)
    k = min(max(nbuckets, 1), n)
    if k == 0:
        return []
    cumulative = np.cumsum(np.asarray(sizes, dtype=np.float64))
    total = cumulative[-1]
    bounds = [0]
    for i in range(1, k):
        cut = int(np.searchsorted(cumulative, total * i / k, side="left")) + 1
        cut = min(max(cut, bounds[-1] + 1), n - (k - i))  # every run keeps at least one
        bounds.append(cut)
    bounds.append(n)
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _run_sums(sizes: list[int], nbuckets: int) -> list[int]:
    sums, start = [], 0
    for length in bucket_partition(sizes, nbuckets):
        sums.append(sum(sizes[start : start + length]))
        start += length
    return sums


def bucket_caps_mb(params: list[torch.Tensor], nbuckets: int) -> list[float]:
    """``bucket_cap_mb_list`` that makes DDP cut ``params`` into ``min(nbuckets, len)`` buckets.

    DDP cuts twice with the same caps: at construction it walks the parameters in
    registration order; after the first step (without ``find_unused_parameters``) it
    rebuilds the buckets once, walking them in the order backward produced their
    gradients, about the reverse. A bucket closes as soon as its bytes reach its cap,
    and the last cap serves every later bucket.

    Cap ``k < n - 1`` is the smaller of bucket ``k``'s bytes in the near-equal cut of the
    registration order and of the reverse order: with a cap at most the designed run's
    bytes, each bucket closes at or before its designed last parameter in both walks,
    so ``n - 1`` buckets close before the last parameter. The last cap is the total bytes,
    so the remainder is one bucket. Exact in both walks; sizes near-equal when the two
    cuts agree (the balance, not the count, is what a lopsided model gives up).
    """
    sizes = [p.numel() * p.element_size() for p in params]
    if not sizes:
        return []
    forward, backward = _run_sums(sizes, nbuckets), _run_sums(sizes[::-1], nbuckets)
    caps = [min(f, b) for f, b in zip(forward[:-1], backward[:-1], strict=True)]
    caps.append(sum(sizes))
    return [c / _MB for c in caps]  # c / 2**20 * 2**20 is exact: DDP's int() gives c back


def _comm_device(device: torch.device) -> torch.device:
    """Where a collective on tensors from ``device`` runs: nccl needs CUDA, gloo takes both."""
    if device.type != "cuda" and dist.get_backend() == "nccl":
        return context.device
    return device


# --- rank 0's start --------------------------------------------------------------------


def _layout_signature(tensors: list[torch.Tensor]) -> int:
    text = ";".join(f"{tuple(t.shape)}:{t.dtype}" for t in tensors)
    return zlib.crc32(text.encode())


def _check_same_layout(tensors: list[torch.Tensor], what: str) -> None:
    """Every rank holds the same number, shapes and dtypes of tensors, or all raise."""
    device = context.device if dist.get_backend() == "nccl" else torch.device("cpu")
    mine = torch.tensor(
        [len(tensors), _layout_signature(tensors)], dtype=torch.int64, device=device
    )
    every = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    if any(not torch.equal(every[0], other) for other in every[1:]):
        counts = [int(t[0]) for t in every]
        raise ConfigError(
            f"{what}: the ranks hold different tensors (counts per rank {counts}, or "
            "different shapes / dtypes), so rank 0's values cannot be broadcast; build the "
            "same model on every rank (only the seed and the data may differ)"
        )


def broadcast_from_rank0(tensors: list[torch.Tensor], what: str) -> int:
    """Copy rank 0's values of ``tensors`` into every rank's (one broadcast per dtype).

    ``what`` names the tensors in the error raised on every rank when the ranks' tensors
    differ in number, shape or dtype. Returns the number of broadcasts (0 with one rank).
    """
    tensors = [t for t in tensors if t is not None and not t.is_meta]
    if not dist.is_initialized() or dist.get_world_size() <= 1:
        return 0
    _check_same_layout(tensors, what)
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    with torch.no_grad():
        for (_, device), group in groups.items():
            flat = _flatten_dense_tensors([t.detach() for t in group]).to(_comm_device(device))
            dist.broadcast(flat, src=0)
            flat = flat.to(device)
            for t, value in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
                t.copy_(value)
    return len(groups)


# --- mean gradients --------------------------------------------------------------------

_REPLICATED: dict[int, tuple[weakref.ref, int]] = {}
"""id -> (weak parameter, grad_nbuckets), for the parameters made data parallel without DDP
(made under hb.scope, or in a model data_parallel left unwrapped); the entry leaves with the
parameter."""
_STEP_HOOK: list = []


def _forget(key: int) -> Callable[[weakref.ref], None]:
    def forget(ref: weakref.ref) -> None:
        entry = _REPLICATED.get(key)
        if entry is not None and entry[0] is ref:
            del _REPLICATED[key]

    return forget


def mark_replicated(params: list[torch.Tensor], nbuckets: int) -> None:
    """Average these parameters' gradients before any optimizer's ``step()`` (unless DDP does)."""
    for p in params:
        if isinstance(p, torch.nn.Parameter) and not p.is_meta:
            _REPLICATED[id(p)] = (weakref.ref(p, _forget(id(p))), nbuckets)
    if not _STEP_HOOK:
        _STEP_HOOK.append(register_optimizer_step_pre_hook(_average_replicated))


def _replicated_nbuckets(p: torch.Tensor) -> int | None:
    entry = _REPLICATED.get(id(p))
    return entry[1] if entry is not None and entry[0]() is p else None


def _average_replicated(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Global step pre-hook: average the replicated parameters' gradients this step uses."""
    if not _REPLICATED or getattr(optimizer, "reduces_its_gradients", False):
        return
    if not dist.is_initialized() or dist.get_world_size() <= 1:
        return
    params, nbuckets = [], 1
    for group in optimizer.param_groups:
        for p in group["params"]:
            n = _replicated_nbuckets(p)
            if n is not None and _REDUCED_BY_DDP.get(id(p)) is not p:
                params.append(p)
                nbuckets = max(nbuckets, n)
    if params:
        allreduce_gradients(params, nbuckets)


def data_parallel(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` as DDP over the job's ranks with ``grad_nbuckets`` buckets.

    With ``grad_lazy_sync`` the model itself comes back, with rank 0's parameters and
    buffers, and its gradients are averaged before every optimizer ``step()`` instead
    (in ``grad_nbuckets`` buckets). With one rank, the model itself, untouched.
    """
    if not isinstance(model, torch.nn.Module):
        raise InvalidTypeError(
            "model",
            "a torch.nn.Module",
            type(model).__name__,
            message=f"data_parallel: expected a torch.nn.Module, got {type(model).__name__}",
        )
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        return model
    options = context.options
    if not context.init_process_group():
        return model
    device = context.device
    model = model.to(device)
    params = _trainable(model)
    if options.grad_lazy_sync or not params:
        broadcast_from_rank0(
            list(model.parameters()) + list(model.buffers()), f"{type(model).__name__}'s state"
        )
        mark_replicated(params, options.grad_nbuckets)
        return model
    ddp = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb_list=bucket_caps_mb(params, options.grad_nbuckets),
        find_unused_parameters=options.find_unused_parameters,
    )
    _REDUCED_BY_DDP.update({id(p): p for p in params})
    if not options.find_unused_parameters:  # DDP rebuilds its buckets once, after step 1
        _check_rebuilt_buckets(ddp, min(options.grad_nbuckets, len(params)))
    log.info(
        "rank %d/%d: DDP with %d gradient buckets",
        context.rank,
        context.world_size,
        min(options.grad_nbuckets, len(params)),
    )
    return ddp


_CHECK_AT_FORWARD = 4
"""DDP's logging data shows the rebuilt buckets' count one step late: read it before the
4th forward (3 backwards done, the rebuild at the 2nd)."""


def _check_rebuilt_buckets(ddp: torch.nn.parallel.DistributedDataParallel, expected: int) -> None:
    """Warn once when DDP's rebuild gave another count of all-reduces than ``grad_nbuckets``.

    The rebuild follows the order backward produced the gradients; :func:`bucket_caps_mb`
    is exact when that order is the reverse of registration. A model whose ``forward``
    uses its layers in another order than ``__init__`` declares them may get another
    count: training is unchanged (every gradient is averaged), only the overlap is.
    Reads DDP's own logging data (``_get_ddp_logging_data``); skipped if it is missing.
    """
    calls = [0]

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        calls[0] += 1
        if calls[0] < _CHECK_AT_FORWARD:
            return
        handle.remove()
        try:
            data = ddp._get_ddp_logging_data()
        except Exception:  # noqa: BLE001 - a torch without it: nothing to check
            return
        got = data.get("num_buckets_reduced")
        if data.get("has_rebuilt_buckets") and isinstance(got, int) and got != expected:
            log.warning(
                "grad_nbuckets=%d: after its one rebuild DDP makes %d all-reduces per step, "
                "because backward produces the gradients in another order than the reverse "
                "of the parameters' registration (forward uses the layers in another order "
                "than __init__ declares them); declare them in the order forward uses them "
                "to get exactly %d. The gradients are averaged all the same.",
                expected,
                got,
                expected,
            )

    handle = ddp.register_forward_pre_hook(before_forward)


def needs_step_allreduce(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """The parameters whose gradients no DDP model reduces (an hb optimizer must)."""
    return [p for p in params if _REDUCED_BY_DDP.get(id(p)) is not p]


def allreduce_gradients(params: list[torch.Tensor], nbuckets: int) -> int:
    """Average ``params``' gradients over the ranks in ``nbuckets`` flat buckets.

    A parameter without a gradient contributes zeros; it keeps ``grad = None`` when no
    rank has one (the presence flags ride in the last bucket). Returns the number of
    all-reduce calls made (0 without a process group).
    """
    if not params or not dist.is_initialized() or dist.get_world_size() <= 1:
        return 0
    world = dist.get_world_size()
    ordered = list(reversed(params))
    home = ordered[0].device
    comm = _comm_device(home)
    present = torch.tensor([0.0 if p.grad is None else 1.0 for p in ordered], device=comm)
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in ordered]
    calls, start = 0, 0
    runs = bucket_partition([g.numel() * g.element_size() for g in grads], nbuckets)
    for i, length in enumerate(runs):
        chunk = grads[start : start + length]
        flat = _flatten_dense_tensors([g.to(torch.float32) for g in chunk]).to(comm)
        if i == len(runs) - 1:
            flat = torch.cat([flat, present])
        dist.all_reduce(flat)
        calls += 1
        if i == len(runs) - 1:
            flat, present = flat[: -len(ordered)], flat[-len(ordered) :]
        flat = flat.to(home)
        for g, reduced in zip(chunk, _unflatten_dense_tensors(flat, chunk), strict=True):
            g.copy_(reduced / world)
        start += length
    for p, g, seen in zip(ordered, grads, present.tolist(), strict=True):
        if p.grad is None and seen > 0:
            p.grad = g
    return calls
