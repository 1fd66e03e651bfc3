"""The public surface is deliberate: these lists change only on purpose (and then here)."""

import importlib

import pytest

import persia

EXPECTED = {
    "persia.ctx": [
        "BaseCtx",
        "DataCtx",
        "EmbeddingCtx",
        "InferCtx",
        "PersiaTrainingBatch",
        "PreprocessMode",
        "TrainCtx",
        "cnt_ctx",
        "current_ctx",
        "eval_ctx",
    ],
    "persia.data": [
        "DataLoader",
        "IterableDataset",
        "IterableDatasetBase",
        "PersiaTrainingBatch",
        "StreamingDataset",
    ],
    "persia.embedding": ["EmbeddingConfig", "get_default_embedding_config"],
    "persia.embedding.data": [
        "DensePart",
        "IDPart",
        "IDTypeFeature",
        "IDTypeFeatureWithSingleID",
        "Label",
        "MAX_BATCH_SIZE",
        "NdarrayDataBase",
        "NonIDTypeFeature",
        "PersiaBatch",
    ],
    "persia.embedding.optim": ["Adagrad", "Adam", "Optimizer", "SGD"],
    "persia.env": [
        "get_local_rank",
        "get_rank",
        "get_replica_index",
        "get_replica_size",
        "get_world_size",
        "reload_env",
    ],
    "persia.distributed": [
        "BaguaDistributedOption",
        "DDPOption",
        "DistributedBaseOption",
        "get_default_distributed_option",
    ],
    "persia.logger": ["DEFAULT_LOGGER_NAME", "get_default_logger", "get_logger"],
    "persia.utils": ["load_yaml", "setup_seed"],
    "persia.service": ["get_embedding_worker_services"],
}


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_exported_members_are_pinned_and_resolve(module):
    mod = importlib.import_module(module)
    assert sorted(mod.__all__) == sorted(EXPECTED[module])
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{module}.{name}"


def test_top_level_package_exposes_persias_submodules_lazily():
    assert persia.__version__
    assert persia.ctx.TrainCtx is importlib.import_module("persia.ctx").TrainCtx
    with pytest.raises(AttributeError):
        persia.nothing  # noqa: B018
