"""pyrsia.shared.config: PERSIA's YAML keys and defaults, and errors that name file, key path and expectation."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import pytest

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

DATA = Path(__file__).parent / "data"


def _emb(slots: dict, **top) -> dict:
    return {"slots_config": slots, **top}


def _error(data: object, parse=parse_embedding_config, source="embedding_config.yml") -> str:
    with pytest.raises(ConfigError) as info:
        parse(data, source=source)
    return str(info.value)


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


def test_global_defaults_are_persias():
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
    assert ps.num_hashmap_internal_shards == 100
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


MISSPELT = {"common_config": {"checkpointing_config": {"checkpoint_dir": "/tmp/c", "checkpoint_every_n_step": 100}}}  # fmt: skip


def test_an_unknown_key_is_an_error_naming_the_closest_key(monkeypatch):
    monkeypatch.delenv("PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS", raising=False)
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


def test_unknown_keys_can_be_allowed_for_forward_compatibility(monkeypatch):
    """strict=False, or $PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS=1: a warning and the key ignored;
    strict=True wins over the variable."""
    with pytest.warns(ConfigWarning, match='checkpoint_every_n_step: unknown key, ignored .did you mean "checkpoint_every_n_steps"'):  # fmt: skip
        cfg = parse_global_config(MISSPELT, strict=False)
    assert cfg.common_config.checkpointing_config.checkpoint_every_n_steps == 0
    monkeypatch.setenv("PERSIA_ALLOW_UNKNOWN_CONFIG_KEYS", "1")
    with pytest.warns(ConfigWarning):
        parse_global_config(MISSPELT)
    with pytest.raises(ConfigError):
        parse_global_config(MISSPELT, strict=True)


def test_the_flags_set_strictness():
    import argparse

    from pyrsia.shared.cli import add_config_flags

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert parser.parse_args([]).strict_config is None  # the variable decides, else strict
    assert parser.parse_args(["--allow-unknown-config-keys"]).strict_config is False
    assert parser.parse_args(["--strict-config"]).strict_config is True


def test_job_type_is_case_insensitive_and_checked():
    assert parse_global_config({"common_config": {"job_type": "eval"}}).common_config.job_type is (
        JobType.Eval
    )
    message = _error({"common_config": {"job_type": "Serve"}}, parse_global_config, "g.yml")
    assert (
        message == 'g.yml: common_config.job_type: expected one of Train, Eval, Infer, got "Serve"'
    )


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            _emb({"age": {"dim": "8x"}}),
            'slots_config.age.dim: expected a positive integer, got "8x"',
        ),
        (_emb({"age": {"dim": 0}}), "slots_config.age.dim: expected a positive integer, got 0"),
        (
            _emb({"age": {"dim": True}}),
            "slots_config.age.dim: expected a positive integer, got true",
        ),
        (_emb({"age": {}}), "slots_config.age.dim: is required"),
        (
            _emb({"age": {"dim": 8, "sqrt_scaling": "yes"}}),
            'slots_config.age.sqrt_scaling: expected true or false, got "yes"',
        ),
        (
            _emb({"age": {"dim": 8, "embedding_summation": 1}}),
            "slots_config.age.embedding_summation: expected true or false, got 1",
        ),
        (
            _emb({"age": {"dim": 8, "sample_fixed_size": 0}}),
            "slots_config.age.sample_fixed_size: expected a positive integer, got 0",
        ),
        (
            _emb({"age": {"dim": 8, "hash_stack_config": {"hash_stack_rounds": 2}}}),
            "slots_config.age.hash_stack_config.embedding_size: expected a positive integer when hash_stack_rounds > 0, got 0",
        ),
        (
            _emb(
                {
                    "age": {
                        "dim": 8,
                        "hash_stack_config": {"hash_stack_rounds": -1, "embedding_size": 3},
                    }
                }
            ),
            "slots_config.age.hash_stack_config.hash_stack_rounds: expected a non-negative integer, got -1",
        ),
        (
            _emb({"age": {"dim": 8, "index_prefix": 5}}),
            "slots_config.age.index_prefix: is computed from feature_groups",
        ),
        (_emb({"age": 8}), "slots_config.age: expected a mapping of keys to values, got 8"),
        (
            _emb({"age": {"dim": 8}}, feature_index_prefix_bit=0),
            "feature_index_prefix_bit: expected an integer from 1 to 63, got 0",
        ),
        (
            _emb({"age": {"dim": 8}}, feature_index_prefix_bit=64),
            "feature_index_prefix_bit: expected an integer from 1 to 63, got 64",
        ),
        ({}, "slots_config: is required"),
        (None, "slots_config: is required"),
        (_emb({}), "slots_config: expected a non-empty mapping"),
        (["a"], "embedding_config.yml: expected a mapping of keys to values"),
    ],
)
def test_embedding_config_errors_name_file_key_and_expectation(data, expected):
    message = _error(data)
    assert message.startswith("embedding_config.yml: ")
    assert expected in message


def test_feature_group_rules():
    slots = {"a": {"dim": 1}, "b": {"dim": 1}, "c": {"dim": 1}}
    assert 'feature_groups.g[1]: unknown slot "bb" (did you mean "b"?)' in _error(
        _emb(slots, feature_groups={"g": ["a", "bb"]})
    )
    assert "feature_groups.a: a feature group must not have the name of a slot" in _error(
        _emb(slots, feature_groups={"a": ["b"]})
    )
    assert 'feature_groups.h[0]: slot "a" is already in group "g"' in _error(
        _emb(slots, feature_groups={"g": ["a", "b"], "h": ["a"]})
    )
    assert "feature_groups.g: expected a non-empty list of slot names" in _error(
        _emb(slots, feature_groups={"g": []})
    )
    assert "feature_groups: expected a mapping" in _error(_emb(slots, feature_groups=["a"]))


def test_group_order_and_prefixes_follow_persia():
    schema = parse_embedding_config(
        _emb(
            {"a": {"dim": 1}, "b": {"dim": 1}, "c": {"dim": 1}, "d": {"dim": 1}},
            feature_index_prefix_bit=12,
            feature_groups={"g2": ["d"], "g1": ["c", "a"]},
        )
    )
    assert schema.group_order() == (("d",), ("c", "a"), ("b",))
    assert schema.slot_prefixes() == {"d": 1 << 52, "c": 2 << 52, "a": 2 << 52, "b": 3 << 52}


def test_too_many_groups_for_the_prefix_bits_is_an_error():
    slots = {f"s{i}": {"dim": 1} for i in range(4)}
    message = _error(_emb(slots, feature_index_prefix_bit=2))
    assert message.startswith(
        "embedding_config.yml: feature_index_prefix_bit: 2 bits hold at most 3"
    )
    # grouping brings them under the limit
    ok = parse_embedding_config(
        _emb(slots, feature_index_prefix_bit=2, feature_groups={"g": ["s0", "s1"]})
    )
    assert len(ok.group_order()) == 3


def test_unknown_slot_lookup_is_a_config_error():
    schema = parse_embedding_config(_emb({"age": {"dim": 8}}))
    with pytest.raises(ConfigError, match=r'unknown slot "agee" \(did you mean "age"\?\)'):
        schema.slot("agee")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"embedding_worker_config": {"forward_buffer_size": "many"}},
            'embedding_worker_config.forward_buffer_size: expected a positive integer, got "many"',
        ),
        (
            {"embedding_parameter_server_config": {"capacity": -5}},
            "embedding_parameter_server_config.capacity: expected a positive integer, got -5",
        ),
        (
            {"embedding_parameter_server_config": {"enable_incremental_update": "no"}},
            'enable_incremental_update: expected true or false, got "no"',
        ),
        (
            {"embedding_parameter_server_config": {"incremental_dir": 3}},
            "incremental_dir: expected a string, got 3",
        ),
        (
            {"common_config": {"metrics_config": {"push_interval_seconds": 0}}},
            "common_config.metrics_config.push_interval_seconds: expected a positive integer, got 0",
        ),
        (
            {"common_config": {"checkpointing_config": {"num_workers": 1.5}}},
            "common_config.checkpointing_config.num_workers: expected an integer from 1 to 64, got 1.5",
        ),
        (
            {"common_config": {"infer_config": {"servers": "a:1"}}},
            'common_config.infer_config.servers: expected a list of "host:port" strings, got "a:1"',
        ),
        ({"common_config": 3}, "common_config: expected a mapping of keys to values, got 3"),
        (
            {"embedding_parameter_server_config": {"incremental_channel_capacity": 50}},
            "embedding_parameter_server_config.incremental_channel_capacity: has no effect",
        ),
    ],
)
def test_global_config_errors_name_file_key_and_expectation(data, expected):
    message = _error(data, parse_global_config, "global_config.yml")
    assert message.startswith("global_config.yml: ")
    assert expected in message


def test_integral_floats_are_accepted_as_integers():
    cfg = parse_global_config({"embedding_parameter_server_config": {"capacity": 1.0e9}})
    assert cfg.embedding_parameter_server_config.capacity == 1_000_000_000
    assert isinstance(cfg.embedding_parameter_server_config.capacity, int)


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
