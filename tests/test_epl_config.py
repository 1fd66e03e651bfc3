"""persia.epl.Config: EPL's key table, types, defaults, errors, environment; epl.init."""

from __future__ import annotations

import subprocess
import sys

import pytest

import persia.epl as epl
from persia.epl import state
from persia.epl.config import KEYS, Config, env_name
from pyrsia.shared.errors import ConfigError, InvalidInputError

# EPL's configuration page, key by key: (type, default)
EPL_TABLE = {
    "pipeline.num_micro_batch": ("integer", 1),
    "pipeline.num_stages": ("integer", None),
    "pipeline.strategy": ("str", "PreferBackward"),
    "gradient_checkpoint.type": ("str", ""),
    "gradient_checkpoint.end_taskgraph": ("integer", -1),
    "gradient_checkpoint.check_gradients": ("bool", False),
    "zero.level": ("str", ""),
    "offload.level": ("str", ""),
    "amp.level": ("str", ""),
    "amp.debug_log": ("bool", False),
    "amp.loss_scale": ("integer/str", "dynamic"),
    "optimizer.num_apply_group": ("integer", 1),
    "cluster.device_place_prefer_intra_node": ("bool", True),
    "cluster.run_visible_devices": ("str", ""),
    "cluster.colocate_split_and_replicate": ("bool", False),
    "communication.num_communicators": ("integer", 2),
    "communication.sparse_as_dense": ("bool", False),
    "communication.max_splits": ("integer", 5),
    "communication.fp16": ("bool", False),
    "communication.fp16_scale": ("integer", 128),
    "communication.clip_after_allreduce": ("bool", False),
    "communication.gradients_reduce_method": ("str", "mean"),
    "io.slicing": ("bool", False),
    "io.unbalanced_io_slicing": ("bool", False),
    "io.drop_last_files": ("bool", False),
    "auto.auto_parallel": ("bool", False),
}


@pytest.fixture(autouse=True)
def _fresh_state():
    state.reset()
    yield
    state.reset()


def test_keys_types_and_defaults_are_epls_table():
    assert {k: (v.type_name, v.default) for k, v in KEYS.items()} == EPL_TABLE
    config = Config(environ={})
    for key, (_, default) in EPL_TABLE.items():
        assert config.get(key) == default
        category, attribute = key.split(".")
        assert getattr(getattr(config, category), attribute) == default


def test_param_dict_values_are_read_and_canonical():
    config = Config(
        {
            "pipeline.num_micro_batch": 4,
            "zero.level": "V1",
            "amp.level": "o1",
            "pipeline.strategy": "preferforward",
            "amp.loss_scale": 128,
            "pipeline.num_stages": 2,
            "cluster.run_visible_devices": "0, 1",
        },
        environ={},
    )
    assert config.pipeline.num_micro_batch == 4 and config.pipeline.num_stages == 2
    assert (config.zero.level, config.amp.level, config.pipeline.strategy) == (
        "v1",
        "O1",
        "PreferForward",
    )
    assert config.amp.loss_scale == 128.0 and config.cluster.run_visible_devices == "0,1"
    assert config.non_default()["pipeline.num_micro_batch"] == 4


def test_unknown_key_names_the_closest_key():
    with pytest.raises(
        ConfigError,
        match='unknown key "pipeline.num_micro_batches" .did you mean "pipeline.num_micro_batch"',
    ):
        Config({"pipeline.num_micro_batches": 4}, environ={})
    with pytest.raises(ConfigError, match='did you mean "zero.level"'):
        Config({"zero.levl": "v1"}, environ={})
    with pytest.raises(ConfigError, match="unknown key"):
        Config(environ={}).pipeline.num_microbatch  # noqa: B018


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("pipeline.num_micro_batch", "4", "a positive integer"),
        ("pipeline.num_micro_batch", 0, "a positive integer"),
        ("pipeline.num_micro_batch", True, "a positive integer"),
        ("pipeline.num_stages", 1.5, "None or a positive integer"),
        ("gradient_checkpoint.check_gradients", 1, "true or false"),
        ("zero.level", "v2", 'one of "" or "v1"'),
        ("amp.level", 1, "a str"),
        ("amp.loss_scale", -1, '"dynamic" or a number > 0'),
        ("amp.loss_scale", "static", '"dynamic" or a number > 0'),
        ("communication.gradients_reduce_method", "max", 'one of "mean" or "sum"'),
        ("cluster.run_visible_devices", "gpu0", "comma-separated device indices"),
        ("gradient_checkpoint.end_taskgraph", -2, "an integer >= -1"),
    ],
)
def test_wrong_type_names_key_expected_and_value(key, value, expected):
    with pytest.raises(InvalidInputError) as info:
        Config({key: value}, environ={})
    message = str(info.value)
    assert key in message and expected in message and repr(value) in message


def test_environment_sets_keys_and_param_dict_wins():
    environ = {
        "EPL_PIPELINE_NUM_MICRO_BATCH": "4",
        "EPL_AMP_LOSS_SCALE": "64",
        "EPL_IO_SLICING": "true",
        "EPL_PIPELINE_NUM_STAGES": "none",
        "EPL_ZERO_LEVEL": "v1",
    }
    config = Config({"zero.level": ""}, environ=environ)
    assert (
        config.pipeline.num_micro_batch == 4
        and config.amp.loss_scale == 64.0
        and config.io.slicing is True
    )
    assert config.pipeline.num_stages is None and config.zero.level == ""
    assert set(config.from_env) == {
        "pipeline.num_micro_batch",
        "amp.loss_scale",
        "io.slicing",
        "pipeline.num_stages",
    }
    assert env_name("communication.fp16_scale") == "EPL_COMMUNICATION_FP16_SCALE"


def test_bad_environment_values_name_the_variable():
    with pytest.raises(
        ConfigError, match="EPL_PIPELINE_NUM_MICRO_BATCH: expected a positive integer"
    ):
        Config(environ={"EPL_PIPELINE_NUM_MICRO_BATCH": "four"})
    with pytest.raises(ConfigError, match="EPL_IO_SLICING: expected true or false"):
        Config(environ={"EPL_IO_SLICING": "maybe"})
    with pytest.raises(
        InvalidInputError, match=r"EPL_ZERO_LEVEL: expected one of \"\" or \"v1\", got 'v3'"
    ):
        Config(environ={"EPL_ZERO_LEVEL": "v3"})


def test_unknown_epl_environment_variable_is_logged(caplog):
    with caplog.at_level("WARNING", logger="persia.epl.config"):
        Config(environ={"EPL_PIPELINE_NUM_MICRO_BATCHES": "2"})
    assert 'did you mean "EPL_PIPELINE_NUM_MICRO_BATCH"' in caplog.text


def test_config_is_immutable_and_comparable():
    config = Config({"amp.level": "O1"}, environ={})
    with pytest.raises(AttributeError, match="immutable"):
        config.amp.level = ""
    with pytest.raises(AttributeError, match="immutable"):
        config.amp = None
    assert config == Config({"amp.level": "o1"}, environ={}) and config != Config(environ={})
    assert "amp.level" in repr(config)
    with pytest.raises(InvalidInputError, match="param_dict"):
        Config([("amp.level", "O1")])


def test_init_stores_the_config_and_reads_env_then(monkeypatch):
    assert epl.current_config() is None
    monkeypatch.setenv("EPL_OPTIMIZER_NUM_APPLY_GROUP", "3")
    config = epl.init()
    assert epl.current_config() is config and config.optimizer.num_apply_group == 3
    given = Config({"amp.level": "O1"})
    assert epl.init(given) is given and epl.current_config() is given
    with pytest.raises(InvalidInputError, match="config"):
        epl.init({"amp.level": "O1"})


def test_import_reads_no_environment():
    code = (
        "import os; os.environ['EPL_PIPELINE_NUM_MICRO_BATCH'] = 'x'; import persia.epl as epl; "
        "import persia.ctx; assert epl.current_config() is None; print('clean')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "clean" in out.stdout, out.stderr


def test_public_surface_is_pinned():
    assert sorted(epl.__all__) == [
        "Config",
        "FileListDataset",
        "KEYS",
        "add_to_collection",
        "clip_by_global_norm",
        "current_config",
        "init",
        "slice_files",
    ]
