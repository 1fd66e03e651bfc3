"""persia.hb sharded torch embeddings: step time through the PS vs the same model with local tables.

The model of ``examples/hb_adult/train.py`` (an ``nn.EmbeddingBag`` over 8 columns, an
``nn.Embedding``, an MLP) is trained on UCI Adult batches in this process, twice per
batch size, in the same run:

- local: the tables in the process (``torch.optim.SGD`` on everything) - the baseline;
- sharded: built in ``hb.scope(sharding=True)``; each module call is one
  ``/lookup_direct`` to a real embedding worker (one PS replica behind it, both real
  processes on loopback) and each backward one ``/gradients`` (``emb_staleness`` 10).

Reported per step: wall time of the whole step, of the forward (lookups included) and of
backward + optimizer step (gradient sends are asynchronous); the ratio sharded / local.
The machine may be shared: compare the ratios of one run, not absolute times across runs.
Ends with ``RESULT local_step_ms=... sharded_step_ms=... ratio=...`` for the largest batch.

    python benchmarks/hb_bench.py [--steps 60] [--batch-sizes 128,1024] [--json F]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from _common import REPO, Cluster, print_table, write_json
from plots import bar_chart_from_rows, saved

sys.path.insert(0, str(REPO / "examples" / "hb_adult"))

from train import WideModel, adult_dataset  # noqa: E402

import persia.hb as hb  # noqa: E402
from persia.hb._ps import connection  # noqa: E402
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER  # noqa: E402


def _steps(model, optimizer, data, batch: int, steps: int) -> dict[str, float]:
    dense, cats, education, label = data.tensors
    loss_fn = torch.nn.BCEWithLogitsLoss()
    forward, backward, total = [], [], []
    for i in range(steps + 5):  # 5 warm-up steps
        start = (i * batch) % (len(label) - batch)
        b = slice(start, start + batch)
        t0 = time.perf_counter()
        loss = loss_fn(model(dense[b], cats[b], education[b]), label[b])
        t1 = time.perf_counter()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        t2 = time.perf_counter()
        if i >= 5:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
            total.append(t2 - t0)
    hb.train.flush()
    ms = 1000.0
    return {
        "step_ms": statistics.median(total) * ms,
        "forward_ms": statistics.median(forward) * ms,
        "backward_ms": statistics.median(backward) * ms,
    }


def _compare(data, batch: int, steps: int) -> dict:
    """``steps`` steps of the local model and of the sharded one at ``batch``, side by side."""
    torch.manual_seed(0)
    local = WideModel()
    local_r = _steps(local, torch.optim.SGD(local.parameters(), lr=0.1), data, batch, steps)
    with hb.scope(sharding=True):
        sharded = WideModel()
    opt = hb.wraps(torch.optim.SGD)(sharded.parameters(), lr=0.1)
    sharded_r = _steps(sharded, opt, data, batch, steps)
    return {
        "batch": batch,
        **{f"local_{k}": v for k, v in local_r.items()},
        **{f"sharded_{k}": v for k, v in sharded_r.items()},
        "ratio": sharded_r["step_ms"] / local_r["step_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-sizes", default="128,1024")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    data = adult_dataset("train")
    config = REPO / "examples" / "hb_adult" / "embedding_config.yml"
    with Cluster() as cluster:
        cluster.start(
            "pyrsia.services.embedding_ps",
            ["--port", "0"],
            role=ROLE_EMBEDDING_PS,
            wait_ready=False,
        )
        cluster.start(
            "pyrsia.services.embedding_worker",
            ["--port", "0", "--embedding-config", str(config)],
            role=ROLE_EMBEDDING_WORKER,
        )
        import os

        os.environ.update(cluster.env)
        try:
            rows = [_compare(data, batch, args.steps) for batch in sizes]
        finally:
            connection.close()
    table = [{k: (f"{v:.2f}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows]
    print_table(
        table,
        [
            ("batch", "batch"),
            ("local_step_ms", "local ms/step"),
            ("sharded_step_ms", "sharded ms/step"),
            ("sharded_forward_ms", "sharded fwd"),
            ("sharded_backward_ms", "sharded bwd+step"),
            ("ratio", "sharded/local"),
        ],
    )
    path = write_json("hb_bench", {"steps": args.steps, "rows": rows}, args.json)
    print(f"JSON: {path}")
    saved(
        bar_chart_from_rows(
            path,
            rows,
            "batch",
            {"local_step_ms": "local", "sharded_step_ms": "sharded"},
            title="HybridBackend sharded embedding vs local, per batch size",
            ylabel="ms per step",
        )
    )
    last = rows[-1]
    print(
        f"RESULT local_step_ms={last['local_step_ms']:.3f} "
        f"sharded_step_ms={last['sharded_step_ms']:.3f} ratio={last['ratio']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
