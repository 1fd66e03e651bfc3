"""NN-worker script of the end-to-end benchmark: train one pass, time it, evaluate, report.

Run by ``persia-launcher nn-worker benchmarks/e2e/train.py --nproc-per-node 1``.
Environment: ``E2E_DATA`` (npz from ``data.prepare``), ``E2E_RESULT`` (where rank 0
writes its JSON), ``E2E_THREADS`` (torch threads), ``E2E_STALENESS`` (embedding
staleness bound), ``E2E_MAX_STEPS`` (0 = the whole stream), ``E2E_PROFILE`` (write a
cProfile of the training loop there).

Timing: the training loop runs from the moment the first batch is in hand to the
moment the last backward's embedding gradients are applied (``wait_for_gradients``),
so start-up (processes, registry, the first lookup) and evaluation are excluded and
reported separately. Inside the loop the time is split into waiting for the next
looked-up batch (``wait``), forward, backward (incl. the dense step and handing the
gradients over) and the final flush.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import torch
from data import load, persia_batches, roc_auc
from model import ADAGRAD_EPS, DENSE_LR, EMBEDDING_LR, INIT_RANGE, INITIAL_ACCUMULATOR, build_model

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset, StreamingDataset
from persia.embedding import EmbeddingConfig
from persia.embedding.optim import Adagrad
from persia.env import get_rank

TEST_BATCH = 4096


class TestSet(IterableDataset):
    def __init__(self, data: dict) -> None:
        super().__init__(buffer_size=8)
        self.data = data

    def __iter__(self):
        yield from persia_batches(self.data, "test", TEST_BATCH, requires_grad=False)


def main() -> None:
    t_main = time.time()
    torch.set_num_threads(int(os.environ.get("E2E_THREADS", "1")))
    data = load(os.environ["E2E_DATA"])
    staleness = int(os.environ.get("E2E_STALENESS", "8"))
    max_steps = int(os.environ.get("E2E_MAX_STEPS", "0")) or None
    model = build_model(len(data["slot_names"]), data["train_dense"].shape[1])
    loss_fn = torch.nn.BCEWithLogitsLoss()
    ctx_args = dict(
        model=model,
        embedding_optimizer=Adagrad(
            lr=EMBEDDING_LR, initial_accumulator_value=INITIAL_ACCUMULATOR, eps=ADAGRAD_EPS
        ),
        dense_optimizer=torch.optim.Adam(model.parameters(), lr=DENSE_LR),
        embedding_config=EmbeddingConfig(emb_initialization=INIT_RANGE, weight_bound=0),
        mixed_precision=False,
    )
    split = {"wait": 0.0, "forward": 0.0, "backward": 0.0, "flush": 0.0}
    losses: list[float] = []
    samples = 0
    with TrainCtx(**ctx_args) as ctx:
        loader = DataLoader(
            StreamingDataset(buffer_size=16),
            reproducible=True,
            embedding_staleness=staleness,
        )
        t_ready = time.time()
        it = iter(loader)
        batch = next(it, None)
        profiler = None
        if os.environ.get("E2E_PROFILE"):  # cProfile of the training thread's loop
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        t0 = time.perf_counter()
        t_first = time.time()
        while batch is not None:
            t1 = time.perf_counter()
            output, labels = ctx.forward(batch)
            loss = loss_fn(output, labels[0])
            t2 = time.perf_counter()
            ctx.backward(loss)
            t3 = time.perf_counter()
            split["forward"] += t2 - t1
            split["backward"] += t3 - t2
            losses.append(float(loss.detach()))
            samples += batch.batch_size
            if max_steps is not None and len(losses) >= max_steps:
                break
            batch = next(it, None)
            split["wait"] += time.perf_counter() - t3
        t4 = time.perf_counter()
        ctx.wait_for_gradients()
        t5 = time.perf_counter()
        split["flush"] = t5 - t4
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(os.environ["E2E_PROFILE"])
        train_seconds = t5 - t0
        t_end = time.time()

        model.eval()
        scores, labels_all = [], []
        with eval_ctx(model=model) as ectx, torch.no_grad():
            for b in DataLoader(TestSet(data)):
                out, lab = ectx.forward(b)
                scores.append(out.numpy().reshape(-1))
                labels_all.append(lab[0].numpy().reshape(-1))
        eval_seconds = time.time() - t_end
        auc = roc_auc(np.concatenate(labels_all), np.concatenate(scores))

    if (get_rank() or 0) == 0:
        result = {
            "samples": samples, "steps": len(losses), "train_seconds": train_seconds,
            "samples_per_s": samples / train_seconds, "auc": auc,
            "eval_seconds": eval_seconds, "split_seconds": split,
            "threads": torch.get_num_threads(), "staleness": staleness,
            "t_main": t_main, "t_ready": t_ready, "t_first": t_first, "t_end": t_end,
            "first_losses": losses[:3], "last_losses": losses[-3:],
        }  # fmt: skip
        with open(os.environ["E2E_RESULT"], "w") as fh:
            json.dump(result, fh)
        print(f"e2e train: {samples} samples in {train_seconds:.2f}s, test AUC {auc:.4f}")


if __name__ == "__main__":
    main()
