"""The baseline side of the end-to-end benchmark (``e2e_bench.py``): the single-process
PyTorch run (``baseline.py``), or the TorchRec peer (``torchrec_peer.py``), on the same
batches as the Pyrsia runs, with its CPU seconds and page faults over the timed steps.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from baseline import array_batches, train_single_process
from e2e.model import (
    ADAGRAD_EPS,
    DENSE_LR,
    EMBEDDING_DIM,
    EMBEDDING_LR,
    INIT_RANGE,
    INITIAL_ACCUMULATOR,
    SEED,
    build_model,
)
from e2e.procs import minor_faults
from e2e_runs import BATCH
from torchrec_peer import TorchRecEmbeddings

from pyrsia.services.nn_worker.step_clock import StepClock


def run_baseline(
    data: dict[str, Any],
    *,
    threads: int,
    max_steps: int,
    bf16: bool = False,
    torchrec: bool = False,
    fused_adam: bool = False,
) -> dict[str, Any]:
    """The single-process PyTorch run on the same batches (``threads`` torch threads);
    with ``torchrec`` the TorchRec peer (its fused embeddings instead of ``nn.Embedding``),
    with ``fused_adam`` its dense model stepped by ``Adam(fused=True)``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    window = _TimedWindow()
    clock = StepClock()
    slot_sizes = [int(c) for c in data["cardinalities"]]
    factory = _torchrec_factory(slot_sizes) if torchrec else None
    try:
        res = train_single_process(
            array_batches(data["train_cat_ids"], data["train_dense"], data["train_label"], BATCH),
            array_batches(data["test_cat_ids"], data["test_dense"], data["test_label"], 4096),
            slot_sizes=slot_sizes,
            dim=EMBEDDING_DIM,
            model_factory=lambda: build_model(
                len(data["slot_names"]), data["train_dense"].shape[1]
            ),
            embedding_lr=EMBEDDING_LR,
            dense_lr=DENSE_LR,
            initial_accumulator_value=INITIAL_ACCUMULATOR,
            emb_initialization=INIT_RANGE,
            seed=SEED,
            max_steps=max_steps or None,
            progress=window.timed,
            autocast_dtype=torch.bfloat16 if bf16 else None,
            clock=clock,
            embedding_factory=factory,
            fused_adam=fused_adam,
        )
    finally:
        torch.set_num_threads(previous)
    res["threads"] = threads
    res["fused_adam"] = fused_adam
    res["phases"] = clock.snapshot()
    res["cpu_s"], res["page_faults"] = window.cpu_s(), window.page_faults()
    res["first_losses"], res["last_losses"] = res["losses"][:3], res["losses"][-3:]
    del res["losses"]
    return res


class _TimedWindow:
    """CPU seconds and page faults of this process over the timed steps (all but the first):
    ``timed`` wraps the batches and reads both after the first batch and after the last."""

    def __init__(self) -> None:
        self.cpu: list[float] = []
        self.faults: list[int] = []

    def timed(self, batches: Iterable) -> Iterator:
        it = iter(batches)
        first = next(it, None)
        if first is None:
            return
        yield first
        self._read()
        yield from it
        self._read()

    def _read(self) -> None:
        self.cpu.append(time.process_time())
        self.faults.append(minor_faults())

    def cpu_s(self) -> float:
        return self.cpu[-1] - self.cpu[0] if len(self.cpu) == 2 else float("nan")

    def page_faults(self) -> int:
        return self.faults[-1] - self.faults[0] if len(self.faults) == 2 else 0


def _torchrec_factory(slot_sizes: list[int]) -> Callable[[], TorchRecEmbeddings]:
    """The TorchRec peer's embeddings, built when called: after train_single_process seeds
    torch, as the baseline's are."""
    return lambda: TorchRecEmbeddings(
        slot_sizes,
        EMBEDDING_DIM,
        INIT_RANGE,
        lr=EMBEDDING_LR,
        eps=ADAGRAD_EPS,
        initial_accumulator_value=INITIAL_ACCUMULATOR,
    )


def run_baselines(
    name: str,
    data: dict[str, Any],
    args: argparse.Namespace,
    runs: dict[str, list[dict[str, Any]]],
    *,
    threads: int,
    max_steps: int,
) -> None:
    """The baseline at ``threads`` torch threads, and the references the flags ask for
    (TorchRec, fused Adam, bf16 autocast), each appended to its ``runs``."""
    print(f"[{name}] baseline, {threads} torch thread(s) ...", flush=True)
    runs["baseline"].append(run_baseline(data, threads=threads, max_steps=max_steps))
    if args.torchrec:
        print(f"[{name}] TorchRec peer, {threads} torch thread(s) ...", flush=True)
        runs["torchrec"].append(
            run_baseline(data, threads=threads, max_steps=max_steps, torchrec=True)
        )
    if args.fused_adam:
        print(f"[{name}] baseline with fused Adam (reference) ...", flush=True)
        runs["baseline_fused_adam"].append(
            run_baseline(data, threads=threads, max_steps=max_steps, fused_adam=True)
        )
    if args.mixed_precision:
        print(f"[{name}] baseline under bf16 autocast (reference) ...", flush=True)
        runs["baseline_bf16"].append(
            run_baseline(data, threads=threads, max_steps=max_steps, bf16=True)
        )
