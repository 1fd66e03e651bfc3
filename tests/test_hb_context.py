"""hb.context and hb.context.options: rank facts, typed options, env defaults, typos refused."""

from __future__ import annotations

import pytest
import torch

import persia.hb as hb
from persia.embedding.optim import SGD
from persia.hb._options import Options
from pyrsia.shared.errors import ConfigError, InvalidInputError
from tests.nn_helpers import environ


@pytest.fixture(autouse=True)
def fresh_options():
    hb.context.options.reload_env({})
    yield
    hb.context.options.reload_env({})


def test_context_outside_a_launcher_is_rank_0_of_1():
    from persia import env

    with environ(RANK=None, WORLD_SIZE=None, LOCAL_RANK=None):
        env.reload_env()
        assert (hb.context.rank, hb.context.world_size, hb.context.local_rank) == (0, 1, 0)
        assert hb.context.is_chief and hb.context.device == torch.device("cpu")
    env.reload_env()


def test_context_reads_the_launcher_environment():
    from persia import env

    with environ(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1"):
        env.reload_env()
        assert (hb.context.rank, hb.context.world_size, hb.context.local_rank) == (3, 4, 1)
        assert not hb.context.is_chief
    env.reload_env()


def test_options_are_set_globally_and_validated():
    options = hb.context.options
    assert options.grad_nbuckets == 1
    options.grad_nbuckets = 2
    assert hb.context.options.grad_nbuckets == 2
    with pytest.raises(
        InvalidInputError, match=r"grad_nbuckets: expected a positive integer, got 0"
    ):
        options.grad_nbuckets = 0
    with pytest.raises(InvalidInputError, match="grad_nbuckets"):
        options.grad_nbuckets = "2"
    with pytest.raises(InvalidInputError, match="grad_nbuckets"):
        options.grad_nbuckets = True  # a bool is not an int here
    with pytest.raises(InvalidInputError, match="comm_default"):
        options.comm_default = "mpi"
    with pytest.raises(InvalidInputError, match="embedding_optimizer"):
        options.embedding_optimizer = torch.optim.SGD
    options.embedding_optimizer = SGD(lr=0.1)
    assert options.grad_nbuckets == 2  # a refused write leaves the old value


def test_unknown_option_names_are_refused_with_a_suggestion():
    with pytest.raises(
        AttributeError, match=r'unknown option "grad_nbucket" \(did you mean "grad_nbuckets"\?\)'
    ):
        hb.context.options.grad_nbucket = 2
    with pytest.raises(AttributeError, match='did you mean "sharding"'):
        hb.context.options.shardng  # noqa: B018
    with pytest.raises(AttributeError, match="known options"):
        hb.context.options.update(zzz=1)


def test_options_come_from_hb_environment_variables():
    options = Options({"HB_GRAD_NBUCKETS": "3", "HB_SHARDING": "true", "HB_COMM_DEFAULT": "GLOO"})
    assert options.grad_nbuckets == 3 and options.sharding is True
    assert options.comm_default == "gloo"
    assert options.grad_lazy_sync is False  # unset -> default


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"HB_GRAD_NBUCKETS": "two"}, r"HB_GRAD_NBUCKETS: expected a positive integer, got 'two'"),
        ({"HB_GRAD_NBUCKETS": "0"}, r"HB_GRAD_NBUCKETS: expected a positive integer, got '0'"),
        ({"HB_SHARDING": "maybe"}, r"HB_SHARDING: expected true or false"),
        (
            {"HB_COMM_DEFAULT": "mpi"},
            r'HB_COMM_DEFAULT: expected one of "auto" or "nccl" or "gloo"',
        ),
    ],
)
def test_bad_environment_values_name_the_variable(env, message):
    with pytest.raises(ConfigError, match=message):
        Options(env)


def test_the_process_options_read_hb_variables_on_reload():
    with environ(HB_GRAD_NBUCKETS="4"):
        hb.context.options.reload_env()
        assert hb.context.options.grad_nbuckets == 4


def test_scope_sets_options_for_its_block_only():
    with hb.scope(grad_nbuckets=5, grad_lazy_sync=True) as ctx:
        assert ctx is hb.context
        assert hb.context.options.grad_nbuckets == 5 and hb.context.options.grad_lazy_sync
        with hb.scope(grad_nbuckets=6):
            assert hb.context.options.grad_nbuckets == 6
        assert hb.context.options.grad_nbuckets == 5
    assert hb.context.options.grad_nbuckets == 1 and not hb.context.options.grad_lazy_sync
    with pytest.raises(AttributeError, match='did you mean "grad_nbuckets"'):
        with hb.scope(grad_nbucket=2):
            pass


def test_function_runs_in_its_scope_and_validates_at_decoration():
    @hb.function(grad_nbuckets=7)
    def read():
        return hb.context.options.grad_nbuckets

    assert read() == 7 and hb.context.options.grad_nbuckets == 1
    with pytest.raises(InvalidInputError, match="grad_nbuckets"):
        hb.function(grad_nbuckets=-1)
    with pytest.raises(AttributeError, match="did you mean"):
        hb.function(gradnbuckets=2)


def test_public_surface_is_pinned():
    assert sorted(hb.__all__) == [
        "Context",
        "Options",
        "context",
        "data",
        "embedding",
        "function",
        "metrics",
        "scope",
        "train",
        "wraps",
    ]
