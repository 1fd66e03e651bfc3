"""Embedding optimizers of the PS: state layout, state initialization and the update kernel.

A stored row is ``[embedding (dim) | state]`` in float32; the state per optimizer:

    SGD, momentum 0         nothing
    SGD, momentum > 0       buf (dim)                      PyTorch: buf = m*buf + g', buf starts 0
    Adagrad                 a (dim), or a (1) with vectorwise_shared
    Adam                    m (dim) | v (dim) | step (1)

The spec is packed into a small float64 vector (:func:`pack`) so a single compiled kernel serves
every optimizer: ``[kind, lr, weight_decay, p3, p4, p5, p6]``.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from pyrsia.shared.embedding_spec import AdagradSpec, AdamSpec, OptimizerSpec, SGDSpec

NONE, SGD, ADAGRAD, ADAM = -1, 0, 1, 2
OPT_LEN = 7


def pack(spec: OptimizerSpec | None) -> np.ndarray:
    """The float64 parameter vector the kernels read for ``spec`` (kind -1 when None)."""
    p = np.zeros(OPT_LEN, dtype=np.float64)
    p[0] = NONE
    if isinstance(spec, SGDSpec):
        p[:4] = (SGD, spec.lr, spec.weight_decay, spec.momentum)
    elif isinstance(spec, AdagradSpec):
        p[:] = (
            ADAGRAD,
            spec.lr,
            spec.weight_decay,
            spec.initial_accumulator_value,
            spec.g_square_momentum,
            spec.eps,
            1.0 if spec.vectorwise_shared else 0.0,
        )
    elif isinstance(spec, AdamSpec):
        p[:6] = (ADAM, spec.lr, spec.weight_decay, spec.betas[0], spec.betas[1], spec.eps)
    return p


def state_width(spec: OptimizerSpec | None, dim: int) -> int:
    """Number of float32 optimizer-state values stored after a ``dim``-wide embedding."""
    if spec is None:
        return 0
    if isinstance(spec, SGDSpec):
        return dim if spec.momentum > 0 else 0
    if isinstance(spec, AdagradSpec):
        return 1 if spec.vectorwise_shared else dim
    return 2 * dim + 1


def state_layout(spec: OptimizerSpec | None) -> tuple:
    """What must match for stored state to be reusable under another spec of the same layout."""
    if spec is None:
        return ("none",)
    if isinstance(spec, SGDSpec):
        return ("sgd", spec.momentum > 0)
    if isinstance(spec, AdagradSpec):
        return ("adagrad", spec.vectorwise_shared)
    return ("adam",)


def init_state_numpy(rows: np.ndarray, dim: int, spec: OptimizerSpec | None) -> None:
    """Vectorized twin of :func:`init_state` over many rows (used when state columns are added)."""
    rows[:, dim:] = 0.0
    if isinstance(spec, AdagradSpec):
        rows[:, dim:] = spec.initial_accumulator_value


@nb.njit(inline="always", cache=True)
def init_state(row, dim, opt):
    """Fresh optimizer state after the embedding in ``row``."""
    kind = np.int64(opt[0])
    if kind == ADAGRAD:
        row[dim:] = np.float32(opt[3])
    else:
        row[dim:] = 0.0


@nb.njit(inline="always", cache=True)
def finite(g):
    for j in range(g.shape[0]):
        if not math.isfinite(g[j]):
            return False
    return True


@nb.njit(inline="always", cache=True)
def _sgd_step(row, g, dim, opt):
    """SGD with optional momentum, PyTorch's form: buf = m*buf + g', w -= lr*buf."""
    lr = opt[1]
    wd = opt[2]
    mom = opt[3]
    if mom > 0.0:
        for j in range(dim):
            w = np.float64(row[j])
            buf = mom * np.float64(row[dim + j]) + np.float64(g[j]) + wd * w
            row[dim + j] = np.float32(buf)
            row[j] = np.float32(w - lr * buf)
    else:
        for j in range(dim):
            w = np.float64(row[j])
            row[j] = np.float32(w - lr * (np.float64(g[j]) + wd * w))


@nb.njit(inline="always", cache=True)
def _adagrad_step(row, g, dim, opt, tmp):
    """Adagrad, with one accumulator per element or one per vector (``vectorwise_shared``).
    ``tmp`` holds the per-element square roots so they run as their own vectorizable loop."""
    lr = opt[1]
    wd = opt[2]
    gsm = opt[4]
    eps = opt[5]
    if opt[6] != 0.0:
        a = np.float64(row[dim])
        scale = lr / math.sqrt(a + eps)
        sq = 0.0
        for j in range(dim):
            gj = np.float64(g[j])
            w = np.float64(row[j])
            row[j] = np.float32(w - scale * (gj + wd * w))
            sq += gj * gj
        row[dim] = np.float32(a * gsm + sq / dim)
    else:
        for j in range(dim):
            tmp[j] = math.sqrt(np.float64(row[dim + j]) + eps)
        for j in range(dim):
            gj = np.float64(g[j])
            w = np.float64(row[j])
            a = np.float64(row[dim + j])
            row[j] = np.float32(w - lr * (gj + wd * w) / tmp[j])
            row[dim + j] = np.float32(a * gsm + gj * gj)


@nb.njit(inline="always", cache=True)
def _adam_step(row, g, dim, opt):
    """Adam with bias correction; the step count is the row's last state value."""
    lr = opt[1]
    wd = opt[2]
    b1 = opt[3]
    b2 = opt[4]
    eps = opt[5]
    step = np.float64(row[3 * dim]) + 1.0
    row[3 * dim] = np.float32(step)
    bc1 = 1.0 - b1**step
    bc2_sqrt = math.sqrt(1.0 - b2**step)
    step_size = lr / bc1
    for j in range(dim):
        w = np.float64(row[j])
        gj = np.float64(g[j]) + wd * w
        m = b1 * np.float64(row[dim + j]) + (1.0 - b1) * gj
        v = b2 * np.float64(row[2 * dim + j]) + (1.0 - b2) * gj * gj
        row[dim + j] = np.float32(m)
        row[2 * dim + j] = np.float32(v)
        row[j] = np.float32(w - step_size * m / (math.sqrt(v) / bc2_sqrt + eps))


@nb.njit(inline="always", cache=True)
def _clip(row, dim, bound):
    """Clip the embedding (the first ``dim`` values) to [-bound, bound] in float32."""
    fb = np.float32(bound)
    for j in range(dim):
        if row[j] > fb:
            row[j] = fb
        elif row[j] < -fb:
            row[j] = -fb


@nb.njit(inline="always", cache=True)
def apply(row, g, dim, opt, bound, tmp):
    """One optimizer step on ``row`` with gradient ``g``, then clip the embedding to ``bound``.
    ``tmp`` is float64 scratch of at least ``dim`` values (lets the square roots run as their
    own vectorizable loop; the arithmetic is the same, in the same order). Each step helper
    is inlined here at numba IR level, as this function is into the kernels that call it."""
    kind = np.int64(opt[0])
    if kind == SGD:
        _sgd_step(row, g, dim, opt)
    elif kind == ADAGRAD:
        _adagrad_step(row, g, dim, opt, tmp)
    elif kind == ADAM:
        _adam_step(row, g, dim, opt)
    if bound > 0.0:
        _clip(row, dim, bound)
