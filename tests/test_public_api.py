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
        "launcher_verbose",
        "reload_env",
        "set_env",
        "skip_check_data",
    ],
    "persia.errors": [
        "AuthError",
        "BackPressureError",
        "ConfigError",
        "ConfigWarning",
        "ConflictError",
        "DataCtxError",
        "GradientSendError",
        "InvalidInputError",
        "InvalidTypeError",
        "MisuseError",
        "NotFoundError",
        "OptionError",
        "PayloadTooLargeError",
        "PersiaError",
        "PSRestartedEmptyError",
        "ProtocolError",
        "RegistryError",
        "RemoteBackPressureError",
        "RemoteBadRequestError",
        "RemoteConflictError",
        "RemoteError",
        "RemoteNotFoundError",
        "RuntimeClosedError",
        "ServiceUnavailableError",
        "UnknownOptionError",
        "UsageError",
    ],
    "persia.distributed": [
        "BaguaDistributedOption",
        "DDPOption",
        "DistributedBaseOption",
        "get_default_distributed_option",
    ],
    "persia.helper": ["PersiaServiceCtx", "ensure_persia_service"],
    "persia.logger": [
        "COLOR_FORMATTER",
        "DEFAULT_LOGGER_NAME",
        "FILE_LOG_FORMAT",
        "FORMATTER",
        "LOG_COLOR",
        "STREAM_LOG_FORMAT",
        "get_default_logger",
        "get_logger",
        "install_library_handler",
        "levelFilter",
        "setLogger",
        "set_default_logger",
    ],
    "persia.prelude": [
        "OptimizerBase",
        "PersiaBatchDataChannel",
        "PersiaBatchDataReceiver",
        "PersiaBatchDataSender",
        "PersiaCommonContext",
        "PersiaTrainingBatch",
        "check_pyarray_dtype_valid",
        "is_cuda_feature_available",
        "register_submodule",
    ],
    "persia.utils": [
        "MAXIMUM_LOCAL_PORT_NUM",
        "dump_yaml",
        "find_free_port",
        "load_yaml",
        "resolve_binary_execute_path",
        "run_command",
        "setup_seed",
    ],
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


def test_every_exception_class_lives_in_the_one_tree():
    """persia.errors is pyrsia.shared.errors: the same classes, and no other module defines one."""
    import ast
    from pathlib import Path

    import pyrsia.shared.errors

    errors = importlib.import_module("persia.errors")
    assert sorted(errors.__all__) == sorted(pyrsia.shared.errors.__all__)
    for name in errors.__all__:
        assert getattr(errors, name) is getattr(pyrsia.shared.errors, name)
    root = Path(__file__).resolve().parents[1]
    outside = []
    for package in ("persia", "pyrsia"):
        for path in (root / package).rglob("*.py"):
            if path.name == "errors.py" and path.parent.name == "shared":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    getattr(base, "id", getattr(base, "attr", "")).endswith(
                        ("Error", "Exception", "Warning")
                    )
                    for base in node.bases
                ):
                    outside.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    assert outside == [], "exception classes outside pyrsia/shared/errors.py"


def test_http_status_is_a_class_attribute():
    from pyrsia.shared import errors

    assert errors.InvalidInputError.status == 400
    assert errors.PayloadTooLargeError.status == 413
    assert issubclass(errors.PSRestartedEmptyError, errors.ConflictError)
    assert errors.NotFoundError("x").status == 404
    assert errors.RemoteConflictError("x").peer_status == 409
    assert errors.RemoteNotFoundError("x").status == 404
    assert errors.BackPressureError.status == 429
    assert errors.ServiceUnavailableError.status == 503
    assert errors.RemoteError("x", peer_status=500).status == 502
    assert errors.PersiaError.status == 500
