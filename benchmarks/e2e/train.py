"""NN-worker script of the end-to-end benchmark: train one pass, time it, evaluate, report.

Run by ``persia-launcher nn-worker benchmarks/e2e/train.py --nproc-per-node 1``.
Environment: ``E2E_DATA`` (npz from ``data.prepare``), ``E2E_RESULT`` (where rank 0
writes its JSON), ``E2E_THREADS`` (torch threads), ``E2E_STALENESS`` (embedding
staleness bound), ``E2E_MAX_STEPS`` (0 = the whole stream), ``E2E_PROFILE`` (write a
cProfile of the training loop there), ``E2E_MIXED_PRECISION`` (1: ``mixed_precision=True``,
bf16 autocast of the forward pass on the CPU), ``E2E_DENSE_LR_SCALE`` (the dense learning
rate's factor; default the world size), ``E2E_FUSED_ADAM`` (1: the dense model's Adam with
``fused=True``), ``E2E_SEED`` (the dense model's initial weights; default ``model.SEED``),
``E2E_EMB_GRAD_REDUCTION`` (``TrainCtx(embedding_grad_reduction=)``; default ``sum``).

Timing: the training loop runs from the end of the first step (not timed, as on the
baseline's side) to the moment the last backward's embedding gradients are applied
(``wait_for_gradients``), so start-up (processes, registry, the first lookup) and
evaluation are excluded and reported separately. Inside the loop the training thread's
wall and CPU time is split into waiting for the next looked-up batch (``wait``, also as
per-step percentiles), ``features`` (``ctx.prepare_features``: taking the tensors the
runtime built off this thread), ``forward`` (model and loss, under the same autocast
``ctx.forward`` uses), ``autograd`` (loss.backward()), ``gradient_send`` (handing the
embedding gradients to the sender; the finite check every 20 steps), ``dense_step``
(dense optimizer), ``other`` (the rest of the loop on this thread: ``loss.item()``,
bookkeeping) and the final ``flush``; ``threads_cpu_s`` is the CPU time of each thread of
this process over the same window (``/proc/self/task``), ``page_faults`` its page faults
(``getrusage``; see ``pyrsia/shared/allocator.py`` for why they matter).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from data import load, persia_batches, roc_auc
from model import (
    ADAGRAD_EPS,
    DENSE_LR,
    EMBEDDING_LR,
    INIT_RANGE,
    INITIAL_ACCUMULATOR,
    SEED,
    build_model,
)
from procs import minor_faults, threads_cpu, threads_window

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset, StreamingDataset
from persia.distributed import DDPOption
from persia.embedding import EmbeddingConfig
from persia.embedding.optim import Adagrad
from persia.env import get_rank, get_world_size
from pyrsia.services.nn_worker.step_clock import StepClock

TEST_BATCH = 4096


class TestSet(IterableDataset):
    def __init__(self, data: dict) -> None:
        super().__init__(buffer_size=8)
        self.data = data

    def __iter__(self):
        yield from persia_batches(self.data, "test", TEST_BATCH, requires_grad=False)


@dataclass
class Window:
    """What the timed loop leaves: the losses and samples, the clocks' readings at the first
    step's end (``t0`` perf counter, ``t_first`` wall clock) and at the flush's end (``t5``),
    this loop's phases (``clock``), the whole loop as one phase (``whole``), ``ctx``'s phases
    before the window, the per-step waits and the window's thread CPU and page faults."""

    losses: list[float]
    samples: int
    first_samples: int
    t0: float
    t_first: float
    t5: float
    clock: StepClock
    whole: StepClock
    ctx_before: dict
    waits: list[float]
    threads_window: dict[str, float]
    page_faults: int


def main() -> None:
    t_main = time.time()
    if os.environ.get("E2E_THREADS"):  # unset: torch's default, as the README's train.py
        torch.set_num_threads(int(os.environ["E2E_THREADS"]))
    data = load(os.environ["E2E_DATA"])
    options = loader_options()
    max_steps = int(os.environ.get("E2E_MAX_STEPS", "0")) or None
    mixed = os.environ.get("E2E_MIXED_PRECISION") == "1"
    seed = int(os.environ.get("E2E_SEED", str(SEED)))
    model = build_model(len(data["slot_names"]), data["train_dense"].shape[1], seed)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    ctx_args = train_ctx_args(model, mixed)
    with TrainCtx(**ctx_args) as ctx:
        loader = DataLoader(
            StreamingDataset(buffer_size=int(os.environ.get("E2E_BUFFER") or 10)), **options
        )
        t_ready = time.time()
        it = iter(loader)
        batch = next(it, None)
        profiler = start_profiler()
        win = timed_loop(ctx, it, batch, loss_fn, max_steps)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.environ["E2E_PROFILE"])
        train_seconds = win.t5 - win.t0
        t_end = time.time()
        phases = window_phases(win, ctx.step_clock.snapshot())
        rank, world_size = get_rank() or 0, get_world_size() or 1
        own = {
            "samples": win.samples,
            "timed_samples": win.samples - win.first_samples,
            "steps": len(win.losses),
            "train_seconds": train_seconds,
            "phases": phases,
            "threads_cpu_s": win.threads_window,
            "page_faults": win.page_faults,
        }
        totals = job_totals(own, world_size)  # a collective: while the process group exists
        auc = evaluate(model, data)
        eval_seconds = time.time() - t_end

    if world_size > 1:  # each rank's own figures, for the per-rank split
        with open(f"{os.environ['E2E_RESULT']}.rank{rank}", "w") as fh:
            json.dump(own, fh)
    if rank == 0:
        write_result(
            win,
            totals,
            world_size,
            {
                "auc": auc,
                "eval_seconds": eval_seconds,
                "phases": phases,
                "loader_options": options,
                "dense_fused_adam": bool(ctx_args["dense_optimizer"].defaults.get("fused")),
                "t_main": t_main,
                "t_ready": t_ready,
                "t_end": t_end,
            },
        )


def write_result(win: Window, totals: dict[str, Any], world_size: int, extra: dict) -> None:
    """Rank 0's JSON at ``E2E_RESULT``: the job's totals, rank 0's own waits, thread CPU and
    losses, and ``extra`` (AUC, phases, options, times); then its one-line summary."""
    wait_ms = np.array(win.waits or [0.0]) * 1e3
    result = {
        "samples": totals["samples"],
        "steps": totals["steps"],
        "train_seconds": totals["train_seconds"],
        "timed_samples": totals["timed_samples"],
        "timed_steps": totals["steps"] - world_size,
        "rank_timed_steps": len(win.losses) - 1,  # rank 0's: phases and threads_cpu_s are its
        "samples_per_s": totals["timed_samples"] / totals["train_seconds"],
        "nn_workers": world_size,
        "wait_ms": {
            q: float(np.percentile(wait_ms, p)) for q, p in (("p50", 50), ("p90", 90), ("max", 100))
        },
        "threads_cpu_s": win.threads_window,
        "page_faults": win.page_faults,
        "threads": torch.get_num_threads(),
        "dense_lr": DENSE_LR * dense_lr_scale(),
        "t_first": win.t_first,
        "first_losses": win.losses[:3],
        "last_losses": win.losses[-3:],
        **extra,
    }
    with open(os.environ["E2E_RESULT"], "w") as fh:
        json.dump(result, fh)
    print(
        f"e2e train: {totals['samples']} samples on {world_size} rank(s) in "
        f"{totals['train_seconds']:.2f}s, test AUC {extra['auc']:.4f}"
    )


def loader_options() -> dict[str, Any]:
    """The DataLoader's options the environment asks for: ``E2E_STALENESS`` (a number:
    ``embedding_staleness``), ``E2E_REPRODUCIBLE`` (1: ``reproducible=True``); none set: the
    README's ``DataLoader(StreamingDataset(buffer_size=10))``, every option at its default."""
    options: dict[str, Any] = {}
    if os.environ.get("E2E_STALENESS"):
        options["embedding_staleness"] = int(os.environ["E2E_STALENESS"])
    if os.environ.get("E2E_REPRODUCIBLE") == "1":
        options["reproducible"] = True
    return options


def train_ctx_args(model: torch.nn.Module, mixed: bool) -> dict[str, Any]:
    """``TrainCtx``'s arguments: the optimizers and embedding settings of ``model.py``, the
    dense learning rate scaled (``dense_lr_scale``), a free rendezvous port on several ranks."""
    ctx_args = dict(
        model=model,
        embedding_optimizer=Adagrad(
            lr=EMBEDDING_LR, initial_accumulator_value=INITIAL_ACCUMULATOR, eps=ADAGRAD_EPS
        ),
        # Linear scaling rule: n ranks of whole batches average n batches per synchronous
        # step (an effective batch n times the baseline's, n times fewer dense steps), so the
        # dense learning rate is scaled by n (Goyal et al. 2017); ranks that split the
        # baseline's batch average exactly it and keep the rate (E2E_DENSE_LR_SCALE=1).
        dense_optimizer=torch.optim.Adam(
            model.parameters(),
            lr=DENSE_LR * dense_lr_scale(),
            fused=os.environ.get("E2E_FUSED_ADAM") == "1" or None,  # None: Adam's default
        ),
        embedding_config=EmbeddingConfig(emb_initialization=INIT_RANGE, weight_bound=0),
        mixed_precision=mixed,  # bf16 autocast on CPU
        embedding_grad_reduction=os.environ.get("E2E_EMB_GRAD_REDUCTION", "sum"),
    )
    if os.environ.get("E2E_DDP_PORT"):  # several ranks: a free rendezvous port, not 23456
        ctx_args["distributed_option"] = DDPOption(
            backend="gloo", master_port=int(os.environ["E2E_DDP_PORT"])
        )
    return ctx_args


def start_profiler() -> Any:
    """A running ``cProfile.Profile`` of the training thread when ``E2E_PROFILE`` is set."""
    if not os.environ.get("E2E_PROFILE"):
        return None
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def timed_loop(
    ctx: TrainCtx, it: Iterator, batch: Any, loss_fn: torch.nn.Module, max_steps: int | None
) -> Window:
    """The training loop from ``batch`` on, then the final flush: the window is timed from
    the end of the first step to the last gradients applied (see the module's docstring)."""
    clock = StepClock()  # this loop's own phases: wait, forward, flush
    losses: list[float] = []
    samples = 0
    t0 = t_first = None  # the clock starts after the first step, as the baseline's
    first_samples, ctx_before, threads_before, faults_before = 0, {}, {}, 0
    waits: list[float] = []
    while batch is not None:
        clock.start()
        output, labels = ctx.forward(batch)  # the README's loop
        loss = loss_fn(output, labels[0])
        clock.lap("forward")
        ctx.backward(loss)
        losses.append(float(loss.detach()))
        samples += batch.batch_size
        if t0 is None:
            t0, t_first, first_samples = time.perf_counter(), time.time(), samples
            whole = StepClock()  # the timed loop as one phase: "other" is what is left
            whole.start()
            clock, ctx_before, threads_before, faults_before = (
                StepClock(),
                ctx.step_clock.snapshot(),
                threads_cpu(),
                minor_faults(),
            )
        if max_steps is not None and len(losses) >= max_steps:
            break
        clock.start()
        batch = next(it, None)
        clock.lap("wait")
        if t0 is not None:
            waits.append(clock.wall["wait"] - sum(waits))
    whole.lap("loop")
    clock.start()
    ctx.wait_for_gradients()
    clock.lap("flush")
    t5 = time.perf_counter()
    threads_window_s = threads_window(threads_cpu(), threads_before)
    page_faults = minor_faults() - faults_before
    return Window(
        losses,
        samples,
        first_samples,
        t0,
        t_first,
        t5,
        clock,
        whole,
        ctx_before,
        waits,
        threads_window_s,
        page_faults,
    )


def loop_phases(win: Window, ctx_now: dict) -> dict:
    """The training thread's phases over the window: this loop's, ``ctx``'s (``ctx_now`` less
    their reading before the window) and ``other``, the rest of the loop (``loss.item()``,
    bookkeeping, the clocks). ``win`` is any window with ``clock``, ``whole`` and
    ``ctx_before`` (feed_train.py's too)."""
    phases = {**win.clock.snapshot()}
    for name, now in ctx_now.items():
        was = win.ctx_before.get(name, {})
        phases[name] = {k: now[k] - was.get(k, 0.0) for k in now}
    phases["other"] = {
        key: total - sum(v.get(key, 0.0) for k, v in phases.items() if k != "flush")
        for key, total in win.whole.snapshot()["loop"].items()
    }
    return phases


def window_phases(win: Window, ctx_now: dict) -> dict:
    """``loop_phases`` in the report's order."""
    phases = loop_phases(win, ctx_now)
    order = (
        "wait",
        "features",
        "forward",
        "autograd",
        "gradient_send",
        "dense_step",
        "other",
        "flush",
    )
    return {k: phases[k] for k in order if k in phases}


def evaluate(model: torch.nn.Module, data: dict) -> float:
    """The test AUC of ``model`` over the test split, through ``eval_ctx``."""
    model.eval()
    scores, labels_all = [], []
    with eval_ctx(model=model) as ectx, torch.no_grad():
        for b in DataLoader(TestSet(data)):
            out, lab = ectx.forward(b)
            scores.append(out.numpy().reshape(-1))
            labels_all.append(lab[0].numpy().reshape(-1))
    return roc_auc(np.concatenate(labels_all), np.concatenate(scores))


def dense_lr_scale() -> float:
    """The dense learning rate's factor: ``E2E_DENSE_LR_SCALE``, by default the world size (1
    on one rank). The benchmark passes 1 when the ranks split the baseline's batch."""
    scale = os.environ.get("E2E_DENSE_LR_SCALE")
    return float(scale) if scale else float(get_world_size() or 1)


def job_totals(own: dict, world_size: int) -> dict:
    """Samples and batches summed over the ranks; the training window is the slowest rank's."""
    if world_size == 1:
        return own
    counts = torch.tensor([own["samples"], own["timed_samples"], own["steps"]], dtype=torch.int64)
    torch.distributed.all_reduce(counts)
    seconds = torch.tensor([own["train_seconds"]], dtype=torch.float64)
    torch.distributed.all_reduce(seconds, op=torch.distributed.ReduceOp.MAX)
    samples, timed, steps = (int(v) for v in counts.tolist())
    return {
        "samples": samples,
        "timed_samples": timed,
        "steps": steps,
        "train_seconds": float(seconds.item()),
    }


if __name__ == "__main__":
    main()
