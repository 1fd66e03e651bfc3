"""Every public name of PERSIA's Python package exists in Pyrsia with PERSIA's parameters.

The list below is written out from PERSIA's sources (PersiaML/PERSIA persia/*.py and
persia/embedding/*.py, the release with ``embedding_worker`` naming): module-level public
functions, classes and constants, and the public methods of the public classes, each with
the names of its parameters in PERSIA's order (``self`` left out). A PERSIA ``*args`` /
``**kwargs`` that a class only forwards to its base is written out as the base's
parameters. Nothing is fetched.

Pyrsia may add parameters after PERSIA's (keyword-only ones, or trailing ones with defaults);
it may not rename, drop or reorder PERSIA's. Names Pyrsia does not provide on purpose are in
``ABSENT`` with the reason, and the migration guide must name each of them.
``persia.launcher`` and ``persia.k8s_utils`` (command-line entry points) are pinned by their
own tests (tests/test_epl_launcher.py, tests/test_k8s_manifests.py).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

_ENV_GETTERS = [
    "get_world_size",
    "get_rank",
    "get_local_rank",
    "get_replica_size",
    "get_replica_index",
]
_CONVERT = ["model", "world_size", "rank_id", "device_id", "master_addr", "optimizer"]
_EMBEDDING_CTX_BASE = ["threadpool_worker_size", "device_id"]

# (module, dotted name) -> PERSIA's parameter names, or None for a constant / non-callable
PERSIA: dict[tuple[str, str], list[str] | None] = {
    # persia.ctx
    ("persia.ctx", "PreprocessMode"): None,
    ("persia.ctx", "PreprocessMode.TRAIN"): None,
    ("persia.ctx", "PreprocessMode.EVAL"): None,
    ("persia.ctx", "PreprocessMode.INFERENCE"): None,
    ("persia.ctx", "_prepare_feature"): ["persia_training_batch", "preprocess_mode"],
    ("persia.ctx", "BaseCtx"): ["threadpool_worker_size", "device_id"],
    ("persia.ctx", "BaseCtx.common_context"): None,
    ("persia.ctx", "DataCtx"): _EMBEDDING_CTX_BASE,
    ("persia.ctx", "DataCtx.send_data"): ["persia_batch"],
    ("persia.ctx", "EmbeddingCtx"): [
        "preprocess_mode",
        "model",
        "embedding_config",
        "*args",
        "**kwargs",
    ],
    ("persia.ctx", "EmbeddingCtx.configure_embedding_parameter_servers"): ["embedding_config"],
    ("persia.ctx", "EmbeddingCtx.forward"): ["batch"],
    ("persia.ctx", "EmbeddingCtx.prepare_features"): ["persia_training_batch"],
    ("persia.ctx", "EmbeddingCtx.dump_checkpoint"): [
        "dst_dir",
        "dense_filename",
        "jit_dense_filename",
        "blocking",
        "with_jit_model",
    ],
    ("persia.ctx", "EmbeddingCtx.load_checkpoint"): [
        "src_dir",
        "map_location",
        "dense_filename",
        "blocking",
    ],
    ("persia.ctx", "EmbeddingCtx.dump_embedding"): ["dst_dir", "blocking"],
    ("persia.ctx", "EmbeddingCtx.load_embedding"): ["src_dir", "blocking"],
    ("persia.ctx", "EmbeddingCtx.dump_torch_state_dict"): [
        "torch_instance",
        "dst_dir",
        "file_name",
        "is_jit",
    ],
    ("persia.ctx", "EmbeddingCtx.load_torch_state_dict"): [
        "torch_instance",
        "src_dir",
        "map_location",
    ],
    ("persia.ctx", "EmbeddingCtx.wait_for_dump_embedding"): [],
    ("persia.ctx", "EmbeddingCtx.wait_for_load_embedding"): [],
    ("persia.ctx", "EmbeddingCtx.get_embedding_size"): [],
    ("persia.ctx", "EmbeddingCtx.clear_embeddings"): [],
    ("persia.ctx", "EmbeddingCtx.get_embedding_from_data"): ["persia_batch", "device_id"],
    ("persia.ctx", "EmbeddingCtx.get_embedding_from_bytes"): ["data", "device_id"],
    ("persia.ctx", "TrainCtx"): [
        "embedding_optimizer",
        "dense_optimizer",
        "grad_scalar_update_factor",
        "backward_buffer_size",
        "backward_workers_size",
        "grad_update_buffer_size",
        "lookup_emb_directly",
        "mixed_precision",
        "distributed_option",
        "*args",
        "**kwargs",
    ],
    ("persia.ctx", "TrainCtx.wait_servers_ready"): [],
    ("persia.ctx", "TrainCtx.backward"): ["loss", "embedding_gradient_check_frequency"],
    ("persia.ctx", "TrainCtx.dump_checkpoint"): [
        "dst_dir",
        "dense_model_filename",
        "jit_dense_model_filename",
        "opt_filename",
        "blocking",
        "with_jit_model",
    ],
    ("persia.ctx", "TrainCtx.load_checkpoint"): [
        "src_dir",
        "map_location",
        "dense_model_filename",
        "opt_filename",
        "blocking",
    ],
    ("persia.ctx", "cnt_ctx"): [],
    ("persia.ctx", "eval_ctx"): ["*args", "**kwargs"],
    ("persia.ctx", "InferCtx"): ["embedding_worker_address_list", "*args", "**kwargs"],
    ("persia.ctx", "InferCtx.wait_for_serving"): [],
    # persia.data
    ("persia.data", "IterableDatasetBase"): ["buffer_size"],
    ("persia.data", "IterableDatasetBase.consume_dataset"): [],
    ("persia.data", "StreamingDataset"): ["buffer_size"],
    ("persia.data", "StreamingDataset.consume_dataset"): [],
    ("persia.data", "IterableDataset"): ["buffer_size"],
    ("persia.data", "IterableDataset.consume_dataset"): [],
    ("persia.data", "DataLoader"): [
        "dataset",
        "forward_buffer_size",
        "timeout_ms",
        "num_workers",
        "reproducible",
        "embedding_staleness",
    ],
    # persia.distributed
    ("persia.distributed", "DistributedBaseOption"): ["master_port", "master_addr"],
    ("persia.distributed", "DistributedBaseOption.convert2distributed_model"): _CONVERT,
    ("persia.distributed", "DistributedBaseOption.init_with_env_file"): [],
    ("persia.distributed", "DDPOption"): ["initialization_method", "backend", "**options"],
    ("persia.distributed", "DDPOption.convert2distributed_model"): _CONVERT,
    ("persia.distributed", "DDPOption.init_with_env_file"): [],
    ("persia.distributed", "BaguaDistributedOption"): ["algorithm", "**options"],
    ("persia.distributed", "BaguaDistributedOption.convert2distributed_model"): _CONVERT,
    ("persia.distributed", "BaguaDistributedOption.init_with_env_file"): [],
    ("persia.distributed", "get_default_distributed_option"): ["device_id"],
    # persia.embedding
    ("persia.embedding", "EmbeddingConfig"): [
        "emb_initialization",
        "admit_probability",
        "weight_bound",
    ],
    ("persia.embedding", "get_default_embedding_config"): [],
    # persia.embedding.data
    ("persia.embedding.data", "MAX_BATCH_SIZE"): None,
    ("persia.embedding.data", "_ND_ARRAY_SUPPORT_TYPE"): None,
    ("persia.embedding.data", "IDTypeFeature"): ["name", "data"],
    ("persia.embedding.data", "IDTypeFeature.batch_size"): None,
    ("persia.embedding.data", "IDTypeFeatureWithSingleID"): ["name", "data"],
    ("persia.embedding.data", "IDTypeFeatureWithSingleID.batch_size"): None,
    ("persia.embedding.data", "NdarrayDataBase"): ["data", "name"],
    ("persia.embedding.data", "NdarrayDataBase.DEFAULT_NAME"): None,
    ("persia.embedding.data", "NdarrayDataBase.batch_size"): None,
    ("persia.embedding.data", "NdarrayDataBase.name"): None,
    ("persia.embedding.data", "Label"): ["data", "name"],
    ("persia.embedding.data", "NonIDTypeFeature"): ["data", "name"],
    ("persia.embedding.data", "PersiaBatch"): [
        "id_type_features",
        "non_id_type_features",
        "labels",
        "batch_size",
        "requires_grad",
        "meta",
    ],
    ("persia.embedding.data", "PersiaBatch.data"): None,
    ("persia.embedding.data", "PersiaBatch.to_bytes"): [],
    # persia.embedding.optim
    ("persia.embedding.optim", "Optimizer"): None,  # a base class; see ABSENT for its constructor
    ("persia.embedding.optim", "Optimizer.apply"): [],
    ("persia.embedding.optim", "SGD"): ["lr", "momentum", "weight_decay"],
    ("persia.embedding.optim", "Adam"): ["lr", "betas", "weight_decay", "eps"],
    ("persia.embedding.optim", "Adagrad"): [
        "lr",
        "initial_accumulator_value",
        "weight_decay",
        "g_square_momentum",
        "eps",
        "vectorwise_shared",
    ],
    # persia.env
    ("persia.env", "PERSIA_LAUNCHER_VERBOSE"): None,
    ("persia.env", "PERSIA_SKIP_CHECK_DATA"): None,
    ("persia.env", "reload_env"): [],
    ("persia.env", "set_env"): [
        "replica_size",
        "replica_index",
        "world_size",
        "rank",
        "local_rank",
    ],
    **{("persia.env", name): [] for name in _ENV_GETTERS},
    # persia.helper
    ("persia.helper", "PersiaServiceCtx"): [
        "data_loader_func",
        "nn_worker_func",
        "embedding_config",
        "embedding_config_path",
        "global_config",
        "global_config_path",
        "data_loader_replica_num",
        "nproc_per_node",
        "embedding_worker_replica_num",
        "embedding_parameter_replica_num",
        "embedding_worker_port",
        "embedding_parameter_server_port",
        "nats_server_port",
    ],
    ("persia.helper", "ensure_persia_service"): ["*args", "**kwargs"],
    # persia.logger
    ("persia.logger", "levelFilter"): ["level"],
    ("persia.logger", "levelFilter.filter"): ["record"],
    ("persia.logger", "STREAM_LOG_FORMAT"): None,
    ("persia.logger", "FILE_LOG_FORMAT"): None,
    ("persia.logger", "DEFAULT_LOGGER_NAME"): None,
    ("persia.logger", "LOG_COLOR"): None,
    ("persia.logger", "COLOR_FORMATTER"): None,
    ("persia.logger", "FORMATTER"): None,
    ("persia.logger", "setLogger"): [
        "name",
        "log_level",
        "log_filename",
        "enable_file_logger",
        "err_redirect_filepath",
        "enable_err_redirect",
        "err_redirect_level",
    ],
    ("persia.logger", "get_logger"): ["name"],
    ("persia.logger", "set_default_logger"): ["name", "**kwargs"],
    # PERSIA: get_default_logger(name=None, **kwargs), the kwargs being setLogger's options
    ("persia.logger", "get_default_logger"): [
        "name",
        "log_level",
        "log_filename",
        "enable_file_logger",
        "err_redirect_filepath",
        "enable_err_redirect",
        "err_redirect_level",
    ],
    # persia.prelude (PERSIA: names of its Rust core)
    ("persia.prelude", "register_submodule"): ["module", "root_module_path"],
    ("persia.prelude", "PersiaCommonContext"): [
        "threadpool_worker_size",
        "replica_index",
        "replica_size",
        "device_id",
    ],
    ("persia.prelude", "PersiaCommonContext.init_nats_publisher"): ["world_size"],
    ("persia.prelude", "PersiaCommonContext.wait_servers_ready"): [],
    ("persia.prelude", "PersiaCommonContext.configure_embedding_parameter_servers"): [
        "initialize_lower",
        "initialize_upper",
        "admit_probability",
        "enable_weight_bound",
        "weight_bound",
    ],
    ("persia.prelude", "PersiaCommonContext.get_embedding_size"): [],
    ("persia.prelude", "PersiaCommonContext.clear_embeddings"): [],
    ("persia.prelude", "PersiaCommonContext.get_embedding_worker_addr_list"): [],
    ("persia.prelude", "PersiaCommonContext.wait_for_serving"): [],
    ("persia.prelude", "is_cuda_feature_available"): [],
    ("persia.prelude", "OptimizerBase"): None,
    ("persia.prelude", "_PersiaBatch"): None,
    ("persia.prelude", "check_pyarray_dtype_valid"): ["array", "dtype"],
    ("persia.prelude", "PersiaBatchDataChannel"): ["buffer_size"],
    ("persia.prelude", "PersiaBatchDataChannel.get_sender"): [],
    ("persia.prelude", "PersiaBatchDataChannel.get_receiver"): [],
    ("persia.prelude", "PersiaBatchDataSender.send"): ["persia_batch"],
    ("persia.prelude", "PersiaBatchDataReceiver"): None,
    ("persia.prelude", "PersiaTrainingBatch"): None,
    # persia.service
    ("persia.service", "get_embedding_worker_services"): [],
    # persia.utils
    ("persia.utils", "setup_seed"): ["seed"],
    ("persia.utils", "load_yaml"): ["filepath"],
    ("persia.utils", "dump_yaml"): ["content", "filepath"],
    ("persia.utils", "run_command"): ["cmd", "env"],
    ("persia.utils", "resolve_binary_execute_path"): ["binary_name"],
    ("persia.utils", "find_free_port"): ["port", "interval"],
    ("persia.utils", "MAXIMUM_LOCAL_PORT_NUM"): None,
}

ABSENT: dict[tuple[str, str], str] = {
    ("persia.prelude", "Forward"): "persia.data.DataLoader does the lookups",
    ("persia.prelude", "Backward"): "TrainCtx.backward sends the gradients",
    ("persia.prelude", "Tensor"): "no DLPack capsules: batches hold numpy arrays and torch tensors",
    ("persia.prelude", "initialize_dataflow"): "StreamingDataset registers the rank's ingress",
    ("persia.prelude", "PersiaMessageQueueServer"): "services talk HTTP",
    ("persia.prelude", "PersiaMessageQueueClient"): "services talk HTTP",
}

MIGRATION_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guides" / "persia-migration.md"


def _resolve(module: str, dotted: str):
    obj = importlib.import_module(module)
    owner = None
    for part in dotted.split("."):
        owner, obj = (
            obj,
            inspect.getattr_static(obj, part) if inspect.isclass(obj) else getattr(obj, part),
        )
    return owner, obj


def _parameters(obj) -> list[str]:
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    target = obj.__init__ if inspect.isclass(obj) else obj
    names = []
    for p in inspect.signature(target).parameters.values():
        if p.name == "self" or p.kind is p.KEYWORD_ONLY:
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


@pytest.mark.parametrize(("module", "name"), sorted(PERSIA), ids=lambda v: str(v))
def test_persia_name_exists_with_its_parameters(module, name):
    _, obj = _resolve(module, name)
    expected = PERSIA[(module, name)]
    if expected is None:
        return
    got = _parameters(obj)
    if got[-1:] == ["**options"] and expected[-1:] == ["**kwargs"]:
        got[-1] = "**kwargs"
    assert got[: len(expected)] == expected, f"{module}.{name}: PERSIA {expected}, Pyrsia {got}"
    extra = got[len(expected) :]
    assert not [e for e in extra if e.startswith("*") and "*args" not in expected], extra


def test_the_list_covers_every_public_name_of_the_pyrsia_modules_persia_has():
    """Each PERSIA module's names as the list gives them are what the module exports (no
    PERSIA name missing from the vendored list for a module Pyrsia pins with __all__)."""
    for module in {m for m, _ in PERSIA}:
        mod = importlib.import_module(module)
        listed = {n.split(".")[0] for m, n in PERSIA if m == module and not n.startswith("_")}
        missing = (
            listed
            - set(getattr(mod, "__all__", listed))
            - {"PERSIA_LAUNCHER_VERBOSE", "PERSIA_SKIP_CHECK_DATA"}
        )
        assert not missing, f"{module}: PERSIA names not exported: {sorted(missing)}"


@pytest.mark.parametrize(("module", "name"), sorted(ABSENT), ids=lambda v: str(v))
def test_names_left_out_on_purpose_are_documented(module, name):
    mod = importlib.import_module(module)
    assert not hasattr(mod, name), f"{module}.{name} exists now: move it to PERSIA"
    assert f"`{name}`" in MIGRATION_GUIDE.read_text(), (
        f"{name}: not named in {MIGRATION_GUIDE.name}"
    )


def test_top_level_persia_has_the_env_names_as_persias_from_env_import_star():
    """PERSIA's persia/__init__.py does ``from .env import *``: ``persia.get_rank()`` works."""
    import persia
    import persia.env

    for name in [*_ENV_GETTERS, "reload_env", "set_env"]:
        assert getattr(persia, name) is getattr(persia.env, name), name
        assert name in persia.__all__
    assert isinstance(persia.PERSIA_SKIP_CHECK_DATA, bool)
