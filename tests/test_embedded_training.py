"""Embedded mode end to end: the same train.py and data_loader.py through ``persia-launcher run
--embedded`` and through the services, the same results; checkpoints written in either mode
load in the other; the flag and the variable checked before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, IterableDataset
from persia.embedding.optim import Adagrad
from pyrsia.services.embedded.job import reset_embedded_job
from pyrsia.shared.constants import ENV_EMBEDDED, ENV_EMBEDDING_CONFIG
from tests.nn_helpers import EMBEDDING_CONFIG, SmallModel, environ, job_services, make_batch

REPO = Path(__file__).resolve().parent.parent
LAUNCHER = [sys.executable, "-m", "persia.launcher", "run"]

TRAIN_PY = """\
import json, os, sys
import numpy as np, torch
sys.path.insert(0, {repo!r})
from persia.ctx import TrainCtx, eval_ctx
from persia.data import DataLoader, StreamingDataset
from persia.embedding.optim import Adagrad
from tests.nn_helpers import SmallModel, make_batch

torch.manual_seed(7)
model = SmallModel()
losses = []
with TrainCtx(Adagrad(lr=0.05), torch.optim.Adam(model.parameters(), lr=0.01), model=model,
              mixed_precision=False) as ctx:
    loader = DataLoader(StreamingDataset(buffer_size=4), reproducible=True, embedding_staleness=1)
    for batch in loader:
        output, labels = ctx.forward(batch)
        loss = torch.nn.functional.binary_cross_entropy(output, labels[0])
        ctx.backward(loss)
        losses.append(float(loss.detach()))
    with eval_ctx(model=model) as ectx:
        out, _ = ectx.forward(ectx.get_embedding_from_data(
            make_batch([1000 + i for i in range(8)], requires_grad=False)))
json.dump({{"losses": losses, "eval": out.detach().numpy().ravel().tolist()}},
          open(os.environ["OUT_JSON"], "w"))
"""

DATA_LOADER_PY = """\
import sys
sys.path.insert(0, {repo!r})
from persia.ctx import DataCtx
from tests.nn_helpers import make_batch

with DataCtx() as ctx:
    for i in range(20):
        ctx.send_data(make_batch([1000 + (i * 3 + j) % 11 for j in range(8)], seed=i))
"""


@pytest.fixture(scope="module")
def job_files(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("job")
    (folder / "train.py").write_text(TRAIN_PY.format(repo=str(REPO)))
    (folder / "data_loader.py").write_text(DATA_LOADER_PY.format(repo=str(REPO)))
    (folder / "embedding_config.yml").write_text(EMBEDDING_CONFIG)
    return folder


def _env(**extra: str) -> dict[str, str]:
    drop = ("PERSIA_REDIS_URL", "PERSIA_JOB_ID", ENV_EMBEDDED, "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _run(folder: Path, *flags: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *LAUNCHER,
            *flags,
            "--nn-worker",
            str(folder / "train.py"),
            "--data-loader",
            str(folder / "data_loader.py"),
            "--embedding-config",
            str(folder / "embedding_config.yml"),
        ],
        cwd=folder,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_run_embedded_trains_as_the_services_do(job_files, tmp_path):
    """One process (no Redis: none is started) and the services give the same losses and the
    same evaluation on a fixed seed (reproducible order, staleness 1)."""
    results = {}
    for mode, flags in (("services", ()), ("embedded", ("--embedded",))):
        out = tmp_path / f"{mode}.json"
        proc = _run(job_files, *flags, OUT_JSON=str(out))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        results[mode] = json.loads(out.read_text())
        if mode == "embedded":
            assert "embedded: one process, no Redis" in proc.stdout
            assert "redis " not in proc.stdout and "embedding_worker |" not in proc.stdout
    services, embedded = results["services"], results["embedded"]
    assert len(embedded["losses"]) == len(services["losses"]) == 20
    np.testing.assert_allclose(embedded["losses"], services["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(embedded["eval"], services["eval"], rtol=1e-5, atol=1e-6)
    assert embedded["losses"][-1] != embedded["losses"][0]


def test_persia_embedded_1_selects_the_mode_without_the_flag(job_files, tmp_path):
    out = tmp_path / "out.json"
    proc = _run(job_files, OUT_JSON=str(out), PERSIA_EMBEDDED="1")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "embedded: one process" in proc.stdout
    assert len(json.loads(out.read_text())["losses"]) == 20


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        (("--embedded", "--nproc-per-node", "2"), {}, "--embedded runs one NN-worker rank"),
        ((), {"PERSIA_EMBEDDED": "maybe"}, "$PERSIA_EMBEDDED='maybe': expected 1"),
    ],
)
def test_run_refuses_a_bad_embedded_setting_before_starting(job_files, flags, env, message):
    proc = _run(job_files, *flags, **env)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "nn_worker" not in proc.stdout  # nothing started


# --- checkpoints, in this process (the Python entry: PERSIA_EMBEDDED=1 and TrainCtx) ---------


class ListDataset(IterableDataset):
    def __init__(self, batches):
        super().__init__(buffer_size=4)
        self.batches = batches

    def __iter__(self):
        yield from self.batches


EVAL_BATCH = [2000 + i for i in range(6)]


def _train_or_load(ckpt: Path, *, train: bool) -> tuple[np.ndarray, dict]:
    """Train five batches and dump, or load; the evaluation output and the dense optimizer."""
    torch.manual_seed(1)
    model = SmallModel()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with TrainCtx(Adagrad(lr=0.05), opt, model=model, mixed_precision=False) as ctx:
        if train:
            batches = [
                make_batch([2000 + (i * 3 + j) % 9 for j in range(6)], seed=i) for i in range(5)
            ]
            for batch in DataLoader(ListDataset(batches), embedding_staleness=1):
                output, labels = ctx.forward(batch)
                ctx.backward(torch.nn.functional.binary_cross_entropy(output, labels[0]))
            ctx.dump_checkpoint(str(ckpt))
        else:
            ctx.load_checkpoint(str(ckpt))
        with eval_ctx(model=model) as ectx:
            output, _ = ectx.forward(
                ectx.get_embedding_from_data(make_batch(EVAL_BATCH, requires_grad=False))
            )
    return output.detach().numpy(), opt.state_dict()


def _in_mode(mode: str, redis_url: str, workdir: Path, ckpt: Path, *, train: bool):
    if mode == "embedded":
        config = workdir / "embedding_config.yml"
        workdir.mkdir(parents=True, exist_ok=True)
        config.write_text(EMBEDDING_CONFIG)
        reset_embedded_job()  # a fresh in-process PS
        try:
            with environ(
                **{ENV_EMBEDDED: "1", ENV_EMBEDDING_CONFIG: str(config)},
                RANK=None,
                WORLD_SIZE=None,
                LOCAL_RANK=None,
            ):
                return _train_or_load(ckpt, train=train)
        finally:
            reset_embedded_job()
    env = {"PERSIA_REDIS_URL": redis_url, "PERSIA_JOB_ID": f"emb-{uuid.uuid4().hex[:8]}"}
    with (
        environ(**env, **{ENV_EMBEDDED: None}, RANK=None, WORLD_SIZE=None, LOCAL_RANK=None),
        job_services(env, workdir),
    ):
        return _train_or_load(ckpt, train=train)


@pytest.mark.parametrize(("writer", "reader"), [("embedded", "services"), ("services", "embedded")])
def test_a_checkpoint_loads_in_the_other_mode(redis_server, tmp_path, writer, reader):
    ckpt = tmp_path / "ckpt"
    trained_out, trained_opt = _in_mode(writer, redis_server.url, tmp_path / "w", ckpt, train=True)
    loaded_out, loaded_opt = _in_mode(reader, redis_server.url, tmp_path / "r", ckpt, train=False)
    np.testing.assert_array_equal(loaded_out, trained_out)
    assert loaded_opt["state"][0]["step"] == trained_opt["state"][0]["step"] == 5
    torch.testing.assert_close(
        loaded_opt["state"][0]["exp_avg"], trained_opt["state"][0]["exp_avg"]
    )
