"""EPL keys that act across NN-worker ranks: 2 gloo ranks, the plan TrainCtx installs.

One job (tests/epl_ranks_job.py) runs every scenario on both ranks; each test below
checks one key's effect from the ranks' results.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.epl_helpers import run_two_gloo_ranks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_two_gloo_ranks("tests.epl_ranks_job", tmp_path_factory.mktemp("epl_ranks"))


def test_zero_v1_halves_optimizer_state_and_matches_plain_ddp(ranks):
    for r in ranks:
        assert r["zero_is_zero"]
        assert r["zero_max_param_diff"] < 1e-6 and r["zero_moved"] > 1e-3
        assert 0.3 < r["zero_state_numel"] / r["plain_state_numel"] < 0.7
    assert (
        ranks[0]["zero_state_numel"] + ranks[1]["zero_state_numel"] == ranks[0]["plain_state_numel"]
    )


def test_zero_v1_follows_a_scheduler_on_the_users_optimizer(ranks):
    """lr x1, x0.5, x1 (after a state-dict round trip), then 0: ZeRO steps with those lrs."""
    for r in ranks:
        moved = r["zero_sched_moved"]
        assert min(moved[:3]) > 1e-4, moved  # steps 0-2 move the parameters
        assert moved[3:] == [0.0, 0.0, 0.0], moved  # lr 0 from step 3: they stop, on every rank
        assert r["zero_sched_vs_plain"] < 1e-6  # same schedule, same parameters as plain DDP


def test_zero_v1_keeps_optimizer_state_the_users_optimizer_already_has(ranks):
    for r in ranks:
        assert r["zero_kept_state_diff"] < 1e-6


def test_gradients_reduce_method_sum_is_twice_mean(ranks):
    for r in ranks:
        assert r["sum_minus_2mean"] < 1e-6 and r["mean_norm"] > 1e-3


def test_fp16_allreduce_is_close_but_lossy_and_fp16_scale_saves_small_gradients(ranks):
    for r in ranks:
        assert r["fp16_rel_err"] < 2e-3 and not r["fp16_bit_equal"]
        assert r["tiny_nonzero_scale1"] < 0.2  # 1e-9 gradients underflow in fp16
        assert r["tiny_nonzero_scale_big"] > 0.9 and r["tiny_rel_err_scale_big"] < 2e-2


def test_max_splits_sets_the_bucket_count(ranks):
    for r in ranks:
        assert r["buckets_1"] == 1
        assert 3 <= r["buckets_4"] <= 5 and r["buckets_4"] > r["buckets_1"]


def test_num_communicators_spreads_buckets_over_a_pool(ranks):
    for r in ranks:
        assert r["pool_size_6_3"] == 3 and r["groups_used_6_3"] == [0, 1, 2]
        assert r["pool_size_1_2"] == 2 and r["groups_used_1_2"] == [0]


def test_clip_after_allreduce_chooses_which_gradients_are_clipped(ranks):
    for r in ranks:
        assert r["clip_after_err"] < 1e-6 and r["clip_before_err"] < 1e-6
        assert r["clip_modes_differ"] > 1e-4


def test_micro_batches_under_ddp_equal_whole_batch(ranks):
    for r in ranks:
        assert r["micro_ddp_grad_diff"] < 1e-6


def test_sparse_as_dense_all_reduces_dense_embedding_gradients(ranks):
    for r in ranks:
        assert r["sparse_grad_is_sparse"] is False
    assert ranks[0]["sparse_rows"] == ranks[1]["sparse_rows"]
    rows = ranks[0]["sparse_rows"]
    assert rows[0] == rows[1] == pytest.approx(2.0) and rows[5] == pytest.approx(
        4.0
    )  # mean of both ranks
