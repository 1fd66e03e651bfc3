"""The one option engine (pyrsia.shared.options) behind the YAML files, EPL's Config and
hb.context.options: one "did you mean", one error class, one wording, environment rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from persia.epl import Config
from persia.hb._options import Options
from pyrsia.shared import options
from pyrsia.shared.config import parse_global_config
from pyrsia.shared.errors import ConfigError, InvalidInputError, OptionError, UnknownOptionError

ROOT = Path(__file__).resolve().parents[1]


def _unknown_from_each_surface() -> list[UnknownOptionError]:
    caught = []
    for attempt in (
        lambda: parse_global_config({"common_config": {"job_typ": "Train"}}, strict=True),
        lambda: Config({"zero.levl": "v1"}, environ={}),
        lambda: Options({}).update(grad_nbucket=2),
    ):
        with pytest.raises(UnknownOptionError) as info:
            attempt()
        caught.append(info.value)
    return caught


def test_every_surface_words_an_unknown_name_the_same_way():
    yaml_error, epl_error, hb_error = _unknown_from_each_surface()
    assert '(did you mean "job_type"?)' in str(yaml_error)
    assert '(did you mean "zero.level"?)' in str(epl_error)
    assert '(did you mean "grad_nbuckets"?)' in str(hb_error)


def test_an_unknown_name_is_a_config_error_and_an_attribute_error():
    for error in _unknown_from_each_surface():
        assert isinstance(error, ConfigError) and isinstance(error, AttributeError)
        assert isinstance(error, ValueError)


def test_attribute_protocols_work_on_the_option_objects():
    config = Config({"amp.level": "O1"}, environ={})
    assert not hasattr(config, "pipelin") and not hasattr(config.amp, "levl")
    assert getattr(Options({}), "no_such_option", "fallback") == "fallback"


def test_one_cutoff_decides_what_is_close():
    assert options.closest("grad_nbucket", ["grad_nbuckets", "sharding"]) == "grad_nbuckets"
    assert options.closest("zzz", ["grad_nbuckets", "sharding"]) is None
    assert options.did_you_mean("zzz", ["sharding"]) == ""
    # 0.6: "ab" vs "abcd" (ratio 0.67) is offered, "ab" vs "abcdefg" (0.44) is not
    assert options.closest("ab", ["abcd"]) == "abcd" and options.closest("ab", ["abcdefg"]) is None


@pytest.mark.parametrize(
    ("attempt", "message"),
    [
        (
            lambda: Config({"pipeline.num_micro_batch": 0}, environ={}),
            'EPL config "pipeline.num_micro_batch": expected a positive integer, got 0',
        ),
        (
            lambda: setattr(Options({}), "grad_nbuckets", 0),
            "hb.context.options.grad_nbuckets: expected a positive integer, got 0",
        ),
        (
            lambda: parse_global_config({"embedding_worker_config": {"forward_buffer_size": 0}}),
            "<dict>: embedding_worker_config.forward_buffer_size: expected a positive integer, got 0",
        ),
    ],
)
def test_a_wrong_value_is_one_class_worded_one_way(attempt, message):
    with pytest.raises(OptionError) as info:
        attempt()
    assert str(info.value) == message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, InvalidInputError)


def test_environment_values_are_worded_one_way_and_blank_means_default():
    with pytest.raises(OptionError, match="environment variable EPL_IO_SLICING: expected true or"):
        Config(environ={"EPL_IO_SLICING": "maybe"})
    with pytest.raises(OptionError, match="environment variable HB_SHARDING: expected true or"):
        Options({"HB_SHARDING": "maybe"})
    assert Config(environ={"EPL_PIPELINE_NUM_MICRO_BATCH": " "}).pipeline.num_micro_batch == 1
    assert Options({"HB_GRAD_NBUCKETS": ""}).grad_nbuckets == 1
    for word, value in (("on", True), ("YES", True), ("0", False), ("off", False)):
        assert Config(environ={"EPL_IO_SLICING": word}).io.slicing is value
        assert Options({"HB_SHARDING": word}).sharding is value


def test_a_key_given_in_code_wins_over_the_environment():
    table = options.KeyTable(
        [options.Key("n", options.Integer(1), 1, env="T_N")], subject="t", where=str
    )
    assert table.resolve({"n": 3}, {"T_N": "5"}) == ({"n": 3}, [])
    assert table.resolve({}, {"T_N": "5"}) == ({"n": 5}, ["n"])
    assert table.resolve({}, {}) == ({"n": 1}, [])


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_config_modules_import_each_other_one_way():
    """config -> config_schema -> embedding_schema/global_schema -> options: no module
    imports one above it, not even inside a function (the old config <-> config_schema circle)."""
    order = [
        "config",
        "config_schema",
        "embedding_schema",
        "global_schema",
        "options",
        "option_kinds",
    ]
    for i, name in enumerate(order):
        imported = _imports(ROOT / "pyrsia" / "shared" / f"{name}.py")
        above = {f"pyrsia.shared.{other}" for other in order[: i + 1]}
        assert not imported & above, f"pyrsia/shared/{name}.py imports {imported & above}"
