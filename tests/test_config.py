"""pyrsia.shared.config: PERSIA's YAML keys and defaults, PERSIA's own files, unknown keys,
YAML files and the dict forms (value errors and feature groups: test_config_errors.py)."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest
import yaml

from pyrsia.shared.config import (
    ConfigWarning,
    EmbeddingSchema,
    GlobalConfig,
    HashStackConfig,
    JobType,
    SlotConfig,
    default_global_config,
    load_embedding_config,
    load_global_config,
    parse_embedding_config,
    parse_global_config,
)
from pyrsia.shared.errors import ConfigError
from pyrsia.shared.settings import Settings

DATA = Path(__file__).parent / "data"


def _emb(slots: dict, **top) -> dict:
    return {"slots_config": slots, **top}


# --------------------------------------------------------------------------- defaults


def test_slot_defaults_are_persias():
    schema = parse_embedding_config(_emb({"age": {"dim": 8}}))
    assert schema.slot("age") == SlotConfig(
        name="age",
        dim=8,
        embedding_summation=True,
        sqrt_scaling=False,
        sample_fixed_size=10,
        hash_stack_config=HashStackConfig(0, 0),
    )
    assert schema.feature_index_prefix_bit == 8
    assert schema.feature_groups == ()


def test_global_defaults_are_persias_but_the_internal_shards():
    """PERSIA's defaults, except ``num_hashmap_internal_shards``: unset (one per PS thread)
    where PERSIA's 100 made every PS batch pay for 64 shards."""
    cfg = default_global_config()
    assert parse_global_config(None) == cfg == parse_global_config({})
    common = cfg.common_config
    assert common.job_type is JobType.Train
    assert (common.metrics_config.enable_metrics, common.metrics_config.push_interval_seconds) == (
        False,
        10,
    )
    assert common.metrics_config.job_name == "persia_default_jobname"
    assert common.checkpointing_config.num_workers == 4
    assert common.infer_config.servers == () and common.infer_config.embedding_checkpoint == ""
    ps = cfg.embedding_parameter_server_config
    assert ps.capacity == 1_000_000_000
    assert ps.num_hashmap_internal_shards is None  # one internal shard per PS thread
    assert ps.enable_incremental_update is False
    assert ps.incremental_buffer_size == 1_000_000
    assert ps.incremental_dir == "/workspace/incremental_dir/"
    assert ps.incremental_channel_capacity == 1000
    worker = cfg.embedding_worker_config
    assert (worker.forward_buffer_size, worker.buffered_data_expired_sec) == (1000, 1000)


def test_configs_are_frozen():
    schema = parse_embedding_config(_emb({"age": {"dim": 8}}))
    with pytest.raises(AttributeError):
        schema.feature_index_prefix_bit = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        default_global_config().embedding_worker_config.forward_buffer_size = 1  # type: ignore[misc]


# --------------------------------------------------------------------------- PERSIA's own files


def test_persia_example_embedding_config_loads_its_slot_capacity_ignored(caplog):
    """PERSIA's examples give each slot a capacity PERSIA ignored: known here, ignored, noted."""
    with caplog.at_level(logging.INFO, logger="pyrsia.shared.config"):
        schema = load_embedding_config(DATA / "persia_embedding_config.yml")  # strict by default
    assert schema.slot_names == ("workclass", "education", "marital_status", "occupation")
    assert schema.feature_index_prefix_bit == 12
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 4
    assert "persia_embedding_config.yml: slots_config.workclass.capacity: ignored" in notes[0]


def test_full_embedding_config_parses_every_key():
    schema = load_embedding_config(DATA / "persia_embedding_config_full.yml", strict=True)
    assert schema.slot("user_tags").embedding_summation is False
    assert schema.slot("user_tags").sample_fixed_size == 5
    assert schema.slot("item_tags").sqrt_scaling is True
    assert schema.slot("big_slot").hash_stack_config == HashStackConfig(2, 1_000_000)
    assert schema.feature_groups == (("ids", ("user_id", "item_id")),)


def test_persia_example_global_config_loads_with_its_extra_keys(caplog):
    """push_interval_sec (PERSIA's examples' spelling) counts as push_interval_seconds;
    num_embedding_io_workers is ignored with a note."""
    with caplog.at_level(logging.INFO, logger="pyrsia.shared.config"):
        cfg = load_global_config(DATA / "persia_global_config.yml")  # strict by default
    assert cfg.common_config.metrics_config.push_interval_seconds == 10
    assert cfg.embedding_parameter_server_config.capacity == 1_000_000
    assert cfg.embedding_parameter_server_config.incremental_buffer_size == 5_000_000
    notes = [r.getMessage() for r in caplog.records]
    assert any("common_config.num_embedding_io_workers: ignored" in n for n in notes), notes
    data = {"common_config": {"metrics_config": {"push_interval_sec": 7}}}
    assert parse_global_config(data).common_config.metrics_config.push_interval_seconds == 7
    both = {
        "common_config": {"metrics_config": {"push_interval_sec": 7, "push_interval_seconds": 7}}
    }
    with pytest.raises(
        ConfigError, match="push_interval_sec: and push_interval_seconds are the same"
    ):
        parse_global_config(both)


def test_every_persia_extra_key_is_handled():
    from pyrsia.shared.config import PERSIA_EXTRA_KEYS

    assert set(PERSIA_EXTRA_KEYS) == {
        "slots_config.<slot>.capacity",
        "common_config.num_embedding_io_workers",
        "common_config.metrics_config.push_interval_sec",
    }


def test_persia_infer_config_loads():
    cfg = load_global_config(DATA / "persia_global_config_infer.yml", strict=True)
    assert cfg.common_config.job_type is JobType.Infer
    assert cfg.common_config.infer_config.servers == ("embedding_parameter_server:8888",)
    assert cfg.common_config.infer_config.embedding_checkpoint == "/cache/adult_income_ckpt/"
    assert cfg.common_config.checkpointing_config.num_workers == 8
    assert cfg.common_config.metrics_config.enable_metrics is True


MISSPELT = {
    "common_config": {
        "checkpointing_config": {"checkpoint_dir": "/tmp/c", "checkpoint_every_n_step": 100}
    }
}


def test_an_unknown_key_is_an_error_naming_the_closest_key():
    with pytest.raises(ConfigError) as err:
        parse_global_config(MISSPELT, source="global_config.yml")
    message = str(err.value)
    assert message.startswith(
        "global_config.yml: common_config.checkpointing_config.checkpoint_every_n_step: "
        'unknown key (did you mean "checkpoint_every_n_steps"?)'
    ), message
    assert (
        "--allow-unknown-config-keys" in message and "PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS=1" in message
    )
    with pytest.raises(ConfigError, match=r"slots_config\.age\.pooling: unknown key"):
        parse_embedding_config({"slots_config": {"age": {"dim": 8, "pooling": "sum"}}})


def test_unknown_keys_can_be_allowed_for_forward_compatibility():
    """strict=False, or $PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS=1: a warning and the key ignored;
    strict=True wins over the variable."""
    with pytest.warns(
        ConfigWarning,
        match='checkpoint_every_n_step: unknown key, ignored .did you mean "checkpoint_every_n_steps"',
    ):
        cfg = parse_global_config(MISSPELT, strict=False)
    assert cfg.common_config.checkpointing_config.checkpoint_every_n_steps == 0
    allowed = Settings.from_env({"PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS": "1"})
    with pytest.warns(ConfigWarning):
        parse_global_config(MISSPELT, settings=allowed)
    with pytest.raises(ConfigError):
        parse_global_config(MISSPELT, strict=True, settings=allowed)
    with pytest.raises(ConfigError):  # no settings: the default, errors
        parse_global_config(MISSPELT)


def test_the_flags_set_strictness():
    import argparse

    from pyrsia.shared.cli import add_config_flags

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert parser.parse_args([]).strict_config is None  # the variable decides, else strict
    assert parser.parse_args(["--allow-unknown-config-keys"]).strict_config is False
    assert parser.parse_args(["--strict-config"]).strict_config is True


# --------------------------------------------------------------------------- files


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nope" / "embedding_config.yml"
    with pytest.raises(ConfigError, match=re.escape(f"{path}: no such file")):
        load_embedding_config(path)


def test_invalid_yaml_names_the_line(tmp_path):
    path = tmp_path / "global_config.yml"
    path.write_text("common_config:\n  job_type: Train\n   bad: [\n")
    with pytest.raises(
        ConfigError, match=r"global_config\.yml: line \d+, column \d+: invalid YAML"
    ):
        load_global_config(path)


def test_duplicate_yaml_key_is_an_error_with_its_line(tmp_path):
    path = tmp_path / "embedding_config.yml"
    path.write_text("slots_config:\n  age:\n    dim: 8\n  age:\n    dim: 4\n")
    with pytest.raises(ConfigError, match=r'line 4, column 3: invalid YAML: duplicate key "age"'):
        load_embedding_config(path)


def test_file_errors_carry_the_file_path(tmp_path):
    path = tmp_path / "embedding_config.yml"
    path.write_text("slots_config:\n  age:\n    dim: 8x\n")
    with pytest.raises(ConfigError) as info:
        load_embedding_config(path)
    assert str(info.value) == f'{path}: slots_config.age.dim: expected a positive integer, got "8x"'


def test_empty_global_config_file_gives_defaults(tmp_path):
    path = tmp_path / "global_config.yml"
    path.write_text("")
    assert load_global_config(path) == default_global_config()


# --------------------------------------------------------------------------- dict forms


def test_schema_round_trips_through_its_dict_form():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        schema = load_embedding_config(DATA / "persia_embedding_config_full.yml")
    again = EmbeddingSchema.from_dict(schema.to_dict())
    assert again == schema
    assert again.slot_prefixes() == schema.slot_prefixes()


def test_schema_from_dict_refuses_unknown_keys():
    with pytest.raises(ConfigError, match=r"<wire>: slots_config\.a\.colour: unknown key"):
        EmbeddingSchema.from_dict({"slots_config": {"a": {"dim": 1, "colour": "red"}}})


def test_global_config_round_trips_through_its_dict_form():
    cfg = load_global_config(DATA / "persia_global_config_infer.yml")
    assert GlobalConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["common_config"]["job_type"] == "Infer"
    # every default too: an unset num_hashmap_internal_shards is left out, not written null
    default = default_global_config()
    ps = default.to_dict()["embedding_parameter_server_config"]
    assert "num_hashmap_internal_shards" not in ps
    assert GlobalConfig.from_dict(yaml.safe_load(yaml.safe_dump(default.to_dict()))) == default
