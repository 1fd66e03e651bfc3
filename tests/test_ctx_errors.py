"""Bad use of the contexts and helpers gets a clear error (no services needed unless noted)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from persia.ctx import (
    EmbeddingCtx,
    PersiaTrainingBatch,
    PreprocessMode,
    TrainCtx,
    cnt_ctx,
    eval_ctx,
)
from persia.data import DataLoader, IterableDataset, StreamingDataset
from persia.distributed import BaguaDistributedOption, DDPOption, get_default_distributed_option
from persia.embedding.optim import SGD
from persia.logger import get_default_logger
from persia.utils import setup_seed
from pyrsia.shared.errors import ConfigError, InvalidInputError
from pyrsia.shared.wire.batch import DenseArray, DensePart
from tests.nn_helpers import PooledModel
from tests.rank_launch import nn_worker_argv
from tests.redis_server import free_port


def _batch(labels: bool = True, trainable: bool = True) -> PersiaTrainingBatch:
    dense = DensePart(
        batch_size=2,
        non_id_type_features=(DenseArray(None, np.ones((2, 3), np.int32)),),
        labels=(DenseArray(None, np.zeros((2, 1), np.float32)),) if labels else (),
        meta=None,
    )
    return PersiaTrainingBatch(
        dense,
        embeddings=[("a", np.ones((2, 4), np.float32))],
        requires_grad=trainable,
        worker=0 if trainable else None,
        batch_id=7 if trainable else None,
    )


def test_train_ctx_accepts_persia_tuning_keys_with_a_warning(caplog):
    """PERSIA accepted any grad_update_buffer_size and lookup_emb_directly=False; so does
    Pyrsia, with a warning saying what is kept (neither changes a result here)."""
    model = PooledModel()
    args = (SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1))

    def said() -> list[str]:  # the context's own warnings: a CPU without bf16 adds another
        return [r.getMessage() for r in caplog.records if r.name == "persia.ctx"]

    with caplog.at_level("WARNING", logger="persia.ctx"):
        TrainCtx(*args, model=model, grad_update_buffer_size=60, lookup_emb_directly=True)
        assert not said()
        TrainCtx(*args, model=model, grad_update_buffer_size=100)
        TrainCtx(*args, model=model, lookup_emb_directly=False)
    text = said()
    assert len(text) == 2, text
    assert "grad_update_buffer_size=100" in text[0] and "PERSIA" in text[0]
    assert "lookup_emb_directly=False" in text[1] and "PERSIA" in text[1]
    with pytest.raises(InvalidInputError, match="grad_update_buffer_size"):
        TrainCtx(*args, model=model, grad_update_buffer_size=0)
    with pytest.raises(InvalidInputError, match="lookup_emb_directly"):
        TrainCtx(*args, model=model, lookup_emb_directly="no")


def test_train_ctx_without_optimizers_is_refused():
    model = PooledModel()
    with pytest.raises(TypeError, match="embedding_optimizer"):
        TrainCtx(dense_optimizer=torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    with pytest.raises(TypeError, match="dense_optimizer"):
        TrainCtx(SGD(lr=0.1), None, model=model)
    with pytest.raises(TypeError, match="model"):
        TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(InvalidInputError, match="grad_scalar_update_factor"):
        TrainCtx(
            SGD(lr=0.1),
            torch.optim.SGD(model.parameters(), lr=0.1),
            model=model,
            grad_scalar_update_factor=0,
        )


def test_no_network_work_before_enter():
    model = PooledModel()
    ctx = TrainCtx(SGD(lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1), model=model)
    assert cnt_ctx() is None
    with pytest.raises(RuntimeError, match="outside the context"):
        ctx.backward(torch.ones((), requires_grad=True))
    assert (
        ctx._session is None
    )  # query methods connect on first use (tests/test_ctx_without_with.py)
    ctx.close()  # nothing to release


def test_prepare_features_checks_the_batch():
    ctx = EmbeddingCtx(PreprocessMode.TRAIN, model=PooledModel())
    with pytest.raises(InvalidInputError, match="labels"):
        ctx.prepare_features(_batch(labels=False))
    with pytest.raises(InvalidInputError, match="batch"):
        ctx.prepare_features(_batch(trainable=False))
    with pytest.raises(TypeError, match="PersiaTrainingBatch"):
        ctx.prepare_features("not a batch")
    non_id, embeddings, labels = ctx.prepare_features(_batch())
    assert non_id[0].dtype == torch.int32 and non_id[0].shape == (2, 3)
    assert embeddings[0].requires_grad and embeddings[0].is_leaf
    infer = EmbeddingCtx(PreprocessMode.INFERENCE)
    _, embeddings, labels = infer.prepare_features(_batch(labels=False, trainable=False))
    assert labels is None and not embeddings[0].requires_grad


def test_model_returning_a_non_tensor_is_refused():
    class Bad(torch.nn.Module):
        def forward(self, non_id, embeddings):
            return embeddings[0].detach().numpy()

    with pytest.raises(TypeError, match="the model returned ndarray"):
        eval_ctx(model=Bad()).forward(_batch())
    with pytest.raises(RuntimeError, match="no model"):
        eval_ctx().forward(_batch())


def test_data_loader_needs_a_context_and_valid_arguments():
    with pytest.raises(RuntimeError, match="inside a context"):
        next(iter(DataLoader(StreamingDataset())))
    with pytest.raises(TypeError, match="dataset"):
        DataLoader([1, 2])
    with pytest.raises(InvalidInputError, match="embedding_staleness"):
        DataLoader(IterableDataset(), embedding_staleness=0)
    with pytest.raises(TypeError, match="DataLoader"):
        iter(StreamingDataset())


def test_distributed_options():
    ddp = DDPOption(init_method="file", backend="gloo", sync_file="/tmp/x")
    assert ddp.initialization_method == "file" and ddp.init_with_env_file()
    tcp = DDPOption(backend="gloo", master_addr="10.0.0.1")
    assert tcp.master_port == 23456 and tcp.init_url() == "tcp://10.0.0.1:23456"
    assert get_default_distributed_option(None).backend == "gloo"
    with pytest.raises(InvalidInputError, match="backend"):
        DDPOption(backend="mpi")
    with pytest.raises(InvalidInputError, match="DDPOption options"):
        DDPOption(backend="gloo", master_prot=1)
    with pytest.raises(InvalidInputError, match="sync_file"):
        DDPOption(initialization_method="file", backend="gloo")
    with pytest.raises(ConfigError, match="CUDA"):
        BaguaDistributedOption("gradient_allreduce").convert2distributed_model(PooledModel(), 2, 0)
    with pytest.raises(ConfigError, match="nccl"):
        DDPOption().convert2distributed_model(PooledModel(), 2, 0)


def test_logger_and_seed():
    assert get_default_logger("nn_worker") is get_default_logger()
    setup_seed(3)
    a = torch.rand(3)
    setup_seed(3)
    assert torch.equal(a, torch.rand(3))
    torch.use_deterministic_algorithms(False)
    with pytest.raises(ValueError, match="seed"):
        setup_seed(-1)


def test_launcher_missing_script_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "persia.launcher", "nn-worker", str(tmp_path / "nope.py")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nope.py'}: no such file (set by the script argument)"
    ]


def test_launcher_exit_code_is_the_scripts(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import os, sys\nsys.exit(3 if os.environ['WORLD_SIZE'] == '2' else 1)\n")
    proc = subprocess.run(
        nn_worker_argv(script, 2, master_port=free_port()),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 3, proc.stderr
