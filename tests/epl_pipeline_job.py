"""One rank of the EPL pipeline check (2 gloo ranks; run by tests/test_epl_pipeline.py).

``python -m tests.epl_pipeline_job OUT_DIR`` with RANK, WORLD_SIZE, MASTER_PORT set.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

import persia.epl as epl
from persia.epl.pipeline import PipelineRunner

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)
    )


def main() -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=RANK,
        world_size=WORLD,
        timeout=timedelta(seconds=60),
    )
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 1, generator=gen)
    reference = model()
    nn.functional.mse_loss(reference(x), y).backward()
    expected = {n: p.grad for n, p in reference.named_parameters()}
    results = {}
    for name, cfg, stages in (
        ("1f1b_auto", {"pipeline.strategy": "PreferBackward", "auto.auto_parallel": True}, None),
        ("gpipe_auto", {"pipeline.strategy": "PreferForward", "auto.auto_parallel": True}, None),
        ("gpipe_given", {"pipeline.strategy": "PreferForward"}, lambda m: [m[:3], m[3:]]),
    ):
        config = epl.Config(
            {"pipeline.num_stages": 2, "pipeline.num_micro_batch": 4, **cfg}, environ={}
        )
        mine = copy.deepcopy(reference)
        mine.zero_grad(set_to_none=True)
        runner = PipelineRunner(
            mine if stages is None else stages(mine), nn.functional.mse_loss, config
        )
        loss = runner.step(x if runner.is_first else None, y if runner.is_last else None)
        diffs = [
            float((p.grad - expected[n]).abs().max())
            for n, p in mine.named_parameters()
            if p.grad is not None
        ]
        results[name] = {
            "schedule": type(runner.schedule).__name__,
            "n_params_with_grad": len(diffs),
            "max_grad_diff": max(diffs),
            "loss": None if loss is None else float(loss),
        }
    results["whole_loss"] = float(nn.functional.mse_loss(reference(x), y))
    with open(os.path.join(sys.argv[1], f"rank{RANK}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
