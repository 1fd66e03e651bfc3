"""pyrsia.shared.config: errors that name file, key path and expectation (a bad value, a job
type, feature groups and the prefix bits they need), and how feature groups order the slots."""

from __future__ import annotations

import pytest

from pyrsia.shared.config import JobType, parse_embedding_config, parse_global_config
from pyrsia.shared.errors import ConfigError


def _emb(slots: dict, **top) -> dict:
    return {"slots_config": slots, **top}


def _error(data: object, parse=parse_embedding_config, source="embedding_config.yml") -> str:
    with pytest.raises(ConfigError) as info:
        parse(data, source=source)
    return str(info.value)


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
