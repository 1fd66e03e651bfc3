"""NN-worker script of the feed-rate benchmark: one pass with a dense step that costs no CPU.

Run by ``persia-launcher nn-worker benchmarks/e2e/feed_train.py --nproc-per-node 1`` from
``benchmarks/feed_rate.py``. Environment, as ``train.py``: ``E2E_DATA``, ``E2E_RESULT``,
``E2E_THREADS``, ``E2E_STALENESS``, ``E2E_MAX_STEPS``; and ``FEED_DENSE``, the dense step:

- ``sleep``: the GPU's stand-in. ``time.sleep(FEED_DENSE_MS / 1000)`` takes the place of
  forward, backward and the dense optimizer; the loss handed to ``ctx.backward`` is
  ``StandIn``'s, whose backward hands every slot the fixed tensor ``FEED_GRAD`` of the
  embedding's shape (no arithmetic: a copy into ``.grad``, as a GPU job's device-to-host
  copy), sent and applied by the servers as a real one. The dense model is a
  one-parameter stand-in that gets no gradient; torch runs 1 thread (a GPU job's CPU
  does no dense math).
- ``cpu``: the benchmark's DLRM (``model.py``) on the CPU, as ``train.py`` trains it.
- ``cuda``: the same DLRM on CUDA device 0 (``TrainCtx(device_id=0)``: the batch's tensors
  are copied to the GPU, the gradients back), in full precision.

The training window is ``train.py``'s: from the end of the first step to the last
gradients applied. Rank 0 writes its JSON to ``E2E_RESULT``: samples, steps, seconds,
samples/s, the training thread's phases (wall and CPU seconds: ``features``, ``dense``
the dense step, ``autograd``, ``gradient_send``, ``dense_step``, ``wait``, ``other``),
each thread's CPU seconds and the ``t_first`` / ``t_end`` wall clock of the window; and
``marks``: for the two steps ``FEED_WINDOW="i,j"`` names (the benchmark's steady window),
the wall clock, samples, each thread's CPU seconds and the phases so far after that step.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from data import load
from model import ADAGRAD_EPS, DENSE_LR, EMBEDDING_LR, INIT_RANGE, INITIAL_ACCUMULATOR, build_model
from procs import threads_cpu, threads_window
from train import loop_phases

from persia.ctx import TrainCtx
from persia.data import DataLoader, StreamingDataset
from persia.embedding import EmbeddingConfig
from persia.embedding.optim import Adagrad
from pyrsia.services.nn_worker.step_clock import StepClock

DENSE_MODES = ("sleep", "cpu", "cuda")


class StandIn(torch.autograd.Function):
    """The GPU's stand-in: a zero loss whose backward hands every embedding a fixed gradient.

    The gradients are made once per shape (filled with ``FEED_GRAD``) and handed out again,
    so autograd costs what a GPU job's CPU pays for them: one copy into each embedding's
    ``.grad`` (a GPU job's device-to-host copy of the same bytes), no arithmetic.
    """

    fixed: dict[tuple, torch.Tensor] = {}
    value = 1e-4

    @staticmethod
    def forward(ctx, *embeddings: torch.Tensor) -> torch.Tensor:  # noqa: ARG004
        ctx.shapes = [(tuple(e.shape), e.dtype, e.device) for e in embeddings]
        return embeddings[0].new_zeros(())

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: ARG004
        out = []
        for shape, dtype, device in ctx.shapes:
            key = (shape, dtype, device)
            if key not in StandIn.fixed:
                StandIn.fixed[key] = torch.full(shape, StandIn.value, dtype=dtype, device=device)
            out.append(StandIn.fixed[key])
        return tuple(out)


def stand_in_loss(embeddings: list[torch.Tensor], grad: float) -> torch.Tensor:
    """A loss whose gradient for every embedding is the fixed tensor ``grad`` (see StandIn)."""
    StandIn.value = grad
    return StandIn.apply(*embeddings)


def snapshot(ctx: TrainCtx, clock: StepClock, samples: int) -> dict:
    """Where the job stands after a step: wall clock, samples, each thread's CPU seconds and
    the training thread's phases so far (this loop's and ``ctx.backward``'s)."""
    phases = {**clock.snapshot(), **ctx.step_clock.snapshot()}
    return {"t": time.time(), "samples": samples, "threads_cpu_s": threads_cpu(), "phases": phases}


@dataclass
class FeedWindow:
    """What the timed loop leaves: steps and samples, the samples of the untimed first step,
    the window's wall clock ends (``t_first``, ``t_end``) and seconds, this loop's phases
    (``clock``), the whole loop as one phase (``whole``) and ``ctx``'s phases and each
    thread's CPU seconds before the window."""

    steps: int
    samples: int
    first_samples: int
    t_first: float
    t_end: float
    train_seconds: float
    clock: StepClock
    whole: StepClock
    ctx_before: dict
    threads_before: dict[str, float]


def main() -> None:
    dense = os.environ.get("FEED_DENSE", "sleep")
    if dense not in DENSE_MODES:
        raise SystemExit(f"FEED_DENSE: expected one of {DENSE_MODES}, got {dense!r}")
    dense_s = float(os.environ.get("FEED_DENSE_MS", "2")) / 1e3
    grad = float(os.environ.get("FEED_GRAD", "1e-4"))
    torch.set_num_threads(1 if dense == "sleep" else int(os.environ.get("E2E_THREADS", "1")))
    data = load(os.environ["E2E_DATA"])
    staleness = int(os.environ.get("E2E_STALENESS", "8"))
    max_steps = int(os.environ.get("E2E_MAX_STEPS", "0")) or None
    device_id = 0 if dense == "cuda" else None
    model = dense_model(dense, data, device_id)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    window = os.environ.get("FEED_WINDOW", "")
    marks: dict[int, dict | None] = {int(i): None for i in window.split(",")} if window else {}
    with TrainCtx(**ctx_args(model, device_id)) as ctx:
        loader = DataLoader(
            StreamingDataset(buffer_size=16), reproducible=True, embedding_staleness=staleness
        )
        it = iter(loader)
        batch = next(it, None)
        win = feed_loop(
            ctx,
            it,
            batch,
            dense=dense,
            dense_s=dense_s,
            grad=grad,
            loss_fn=loss_fn,
            max_steps=max_steps,
            marks=marks,
            device_id=device_id,
        )
        threads_window_s = threads_window(threads_cpu(), win.threads_before)
        phases = loop_phases(win, ctx.step_clock.snapshot())
    result = {
        "dense": dense,
        "dense_ms": dense_s * 1e3 if dense == "sleep" else None,
        **window_figures(win),
        "phases": phases,
        "threads_cpu_s": threads_window_s,
        "threads": torch.get_num_threads(),
        "staleness": staleness,
        "marks": {str(k): v for k, v in marks.items()},
        "device": torch.cuda.get_device_name(device_id) if device_id is not None else "cpu",
    }
    with open(os.environ["E2E_RESULT"], "w") as fh:
        json.dump(result, fh)
    print(
        f"feed train ({dense}): {win.samples} samples, {win.steps} steps "
        f"in {win.train_seconds:.2f}s"
    )


def ctx_args(model: torch.nn.Module, device_id: int | None) -> dict[str, Any]:
    """The TrainCtx of the benchmark: Adagrad embeddings, Adam dense, fp32 as the baseline."""
    return dict(
        model=model,
        embedding_optimizer=Adagrad(
            lr=EMBEDDING_LR, initial_accumulator_value=INITIAL_ACCUMULATOR, eps=ADAGRAD_EPS
        ),
        dense_optimizer=torch.optim.Adam(model.parameters(), lr=DENSE_LR),
        embedding_config=EmbeddingConfig(emb_initialization=INIT_RANGE, weight_bound=0),
        mixed_precision=False,  # fp32 on every side, as the baseline
        device_id=device_id,
    )


def window_figures(win: FeedWindow) -> dict[str, Any]:
    """Steps, samples and samples/s of the loop, timed from the end of its first step."""
    timed_steps = win.steps - 1
    timed_samples = win.samples - win.first_samples
    return {
        "samples": win.samples,
        "steps": win.steps,
        "timed_steps": timed_steps,
        "timed_samples": timed_samples,
        "train_seconds": win.train_seconds,
        "samples_per_s": timed_samples / win.train_seconds if timed_steps else 0.0,
        "t_first": win.t_first,
        "t_end": win.t_end,
    }


def dense_model(dense: str, data: dict, device_id: int | None) -> torch.nn.Module:
    """The dense model of ``dense``: a one-parameter stand-in for ``sleep`` (it gets no
    gradient: the step is a sleep), else the benchmark's DLRM (on ``device_id`` for cuda)."""
    if dense == "sleep":
        model: torch.nn.Module = torch.nn.Linear(1, 1)  # gets no gradient: the step is a sleep
    else:
        model = build_model(len(data["slot_names"]), data["train_dense"].shape[1])
        if device_id is not None:
            model = model.cuda(device_id)
    return model


def feed_loop(
    ctx: TrainCtx,
    it: Iterator,
    batch: Any,
    *,
    dense: str,
    dense_s: float,
    grad: float,
    loss_fn: torch.nn.Module,
    max_steps: int | None,
    marks: dict[int, dict | None],
    device_id: int | None,
) -> FeedWindow:
    """The training loop from ``batch`` on, then the final flush (and, on CUDA, the device's
    sync): timed from the end of the first step; fills ``marks`` as its steps come."""
    clock = StepClock()
    steps = samples = 0
    t0 = t_first = None
    first_samples, ctx_before, threads_before = 0, {}, {}
    while batch is not None:
        clock.start()
        one_step(ctx, batch, clock, dense=dense, dense_s=dense_s, grad=grad, loss_fn=loss_fn)
        steps += 1
        samples += batch.batch_size
        if steps in marks:  # the steady window's ends: wall clock, thread CPU, phases
            marks[steps] = snapshot(ctx, clock, samples)
        if t0 is None:
            t0, t_first, first_samples = time.perf_counter(), time.time(), samples
            whole = StepClock()
            whole.start()
            clock = StepClock()
            ctx_before, threads_before = ctx.step_clock.snapshot(), threads_cpu()
        if max_steps is not None and steps >= max_steps:
            break
        clock.start()
        batch = next(it, None)
        clock.lap("wait")
    if t0 is None:
        raise SystemExit("feed_train: the data loader sent no batch")
    whole.lap("loop")
    flush(ctx, clock, device_id if dense == "cuda" else None)
    train_seconds = time.perf_counter() - t0
    t_end = time.time()
    return FeedWindow(
        steps,
        samples,
        first_samples,
        t_first,
        t_end,
        train_seconds,
        clock,
        whole,
        ctx_before,
        threads_before,
    )


def one_step(
    ctx: TrainCtx,
    batch: Any,
    clock: StepClock,
    *,
    dense: str,
    dense_s: float,
    grad: float,
    loss_fn: torch.nn.Module,
) -> None:
    """One training step of ``batch``: features, the dense step (or its sleep), backward."""
    non_id, embeddings, labels = ctx.prepare_features(batch)
    clock.lap("features")
    if dense == "sleep":
        time.sleep(dense_s)
        clock.lap("dense")
        loss = stand_in_loss(embeddings, grad)
    else:
        loss = loss_fn(ctx.model(non_id, embeddings), labels[0])
        clock.lap("dense")
    ctx.backward(loss)


def flush(ctx: TrainCtx, clock: StepClock, cuda_device: int | None) -> None:
    """Wait for the gradients in flight (and the CUDA device's queue), timed as ``flush``."""
    clock.start()
    ctx.wait_for_gradients()
    if cuda_device is not None:
        torch.cuda.synchronize(cuda_device)
    clock.lap("flush")


if __name__ == "__main__":
    main()
