"""The two stacks of ``tests/test_serve_endpoint.py``: a training stack (2 PS replicas
writing incremental packets, 1 embedding worker, Redis) that trains and exports a model, and
a serving stack (2 Infer PS replicas loading the export, ``persia-launcher serve``) with
Redis unreachable (``NO_REDIS``). Processes are started through the caller's ``start``, so
the fixture stops them.
"""

from __future__ import annotations

import torch

from persia.ctx import TrainCtx, eval_ctx
from persia.embedding.optim import Adagrad
from persia.serving import export_model
from pyrsia.shared.constants import ROLE_EMBEDDING_PS, ROLE_EMBEDDING_WORKER
from tests.nn_helpers import SmallModel, make_batch
from tests.redis_server import free_port

IDS = list(range(1, 65))
SCAN_INTERVAL_S = 1
NO_REDIS = "redis://127.0.0.1:1/0"


def train(model, steps: int, ids, seed: int) -> None:
    """``steps`` training steps of ``model`` on batches of ``ids`` (seeds from ``seed``)."""
    with TrainCtx(
        Adagrad(lr=0.2),
        torch.optim.SGD(model.parameters(), lr=0.05),
        model=model,
        mixed_precision=False,
    ) as ctx:
        for step in range(steps):
            out, labels = ctx.forward(
                ctx.get_embedding_from_data(make_batch(ids, seed=seed + step))
            )
            ctx.backward(torch.nn.functional.binary_cross_entropy(out, labels[0]))


def predictions(model, batch):
    """``model``'s eval predictions for ``batch``, with the features it was given."""
    with eval_ctx(model=model) as ctx, torch.no_grad():
        looked_up = ctx.get_embedding_from_data(batch)
        out, _ = ctx.forward(looked_up)
        non_id, emb, _ = ctx.prepare_features(looked_up)
    return out.numpy(), non_id, emb


def train_and_export(root, start, env):
    """The training stack (2 PS replicas writing incremental packets, 1 embedding worker)
    started with ``start``; a SmallModel trained 4 steps, its eval predictions for a probe
    batch taken, and the model exported to ``root / "model"``.

    Returns (model, probe batch, eval predictions, export directory)."""
    common = ["--embedding-config", str(root / "embedding_config.yml")]
    for i in range(2):
        start(
            "pyrsia.services.embedding_ps",
            [
                *common,
                "--global-config",
                str(root / "train.yml"),
                "--port",
                "0",
                "--replica-index",
                str(i),
                "--replica-size",
                "2",
            ],
            env,
            role=ROLE_EMBEDDING_PS,
            replica_index=i,
            wait_ready=False,
        )
    start(
        "pyrsia.services.embedding_worker",
        [*common, "--port", "0"],
        env,
        role=ROLE_EMBEDDING_WORKER,
    )
    model = SmallModel()
    train(model, 4, IDS, seed=0)
    probe = make_batch(IDS, requires_grad=False, seed=99)
    want, non_id, emb = predictions(model, probe)
    with TrainCtx(
        Adagrad(lr=0.2),
        torch.optim.SGD(model.parameters(), lr=0.0),
        model=model,
        mixed_precision=False,
    ) as ctx:
        export = export_model(
            root / "model",
            model,
            example_inputs=(non_id, emb),
            embedding_config=root / "embedding_config.yml",
            ctx=ctx,
        )
    return model, probe, want, export


def start_serving_stack(root, start, env, export, inc):
    """The serving stack, Redis unreachable (``NO_REDIS``): 2 PS replicas with ``job_type:
    Infer`` loading the export's embedding checkpoint and scanning ``inc``, and
    ``persia-launcher serve`` on the export. Returns (the two PS, the serve process)."""
    ports = [free_port(), free_port()]
    servers = "".join(f"\n    - 127.0.0.1:{p}" for p in ports)
    (root / "infer.yml").write_text(
        f"common_config:\n  job_type: Infer\n  infer_config:\n    servers:{servers}\n"
        f"    embedding_checkpoint: {export / 'embedding'}\n"
        "embedding_parameter_server_config:\n  enable_incremental_update: true\n"
        f"  incremental_dir: {inc}\n  incremental_scan_interval_seconds: {SCAN_INTERVAL_S}\n"
    )
    infer_env = {**env, "PERSIA_REDIS_URL": NO_REDIS}
    infer_ps = [
        start(
            "pyrsia.services.embedding_ps",
            [
                "--global-config",
                str(root / "infer.yml"),
                "--port",
                str(p),
                "--replica-index",
                str(i),
                "--replica-size",
                "2",
            ],
            infer_env,
            role="infer_ps",
            replica_index=i,
            address=f"127.0.0.1:{p}",
        )
        for i, p in enumerate(ports)
    ]
    serve_port = free_port()
    serve = start(
        "persia.launcher",
        [
            "serve",
            "--model",
            str(export),
            "--global-config",
            str(root / "infer.yml"),
            "--port",
            str(serve_port),
        ],
        infer_env,
        role="serve",
        address=f"127.0.0.1:{serve_port}",
    )
    return infer_ps, serve
