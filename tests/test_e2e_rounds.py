"""e2e_bench keeps its finished rounds when a run stops part-way (``benchmarks/e2e/rounds.py``).

A long same-run benchmark that is interrupted, or whose fourth round fails, reports the rounds
that finished (each a whole round, so every pair is still a same-run pair) instead of losing
every number; with no round finished, the error is raised as it came.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from e2e.rounds import RoundsDone, finished_rounds, run_rounds  # noqa: E402


def rounds_failing_at(k: int, exc: BaseException) -> tuple[list[int], object]:
    """A round function that raises ``exc`` on its ``k``-th call, and the list of calls."""
    calls: list[int] = []

    def one_round() -> None:
        calls.append(len(calls) + 1)
        if len(calls) == k:
            raise exc

    return calls, one_round


def test_every_round_runs_and_each_is_saved_as_it_finishes():
    saved: list[int] = []
    calls, one_round = rounds_failing_at(99, RuntimeError("never"))
    ended = run_rounds(4, one_round, saved.append)
    assert ended == RoundsDone(4, 4) and ended.complete
    assert calls == [1, 2, 3, 4] and saved == [1, 2, 3, 4]


def test_a_failing_round_keeps_the_finished_ones_and_names_the_cause():
    saved: list[int] = []
    _, one_round = rounds_failing_at(3, RuntimeError("PS exited 1"))
    ended = run_rounds(7, one_round, saved.append)
    assert (ended.done, ended.planned) == (2, 7) and not ended.complete
    assert ended.stopped_by == "RuntimeError: PS exited 1"
    assert saved == [1, 2]
    assert ended.note() == {"done": 2, "planned": 7, "stopped_by": "RuntimeError: PS exited 1"}


def test_ctrl_c_keeps_the_finished_rounds():
    _, one_round = rounds_failing_at(2, KeyboardInterrupt())
    ended = run_rounds(5, one_round, lambda k: None)
    assert (ended.done, ended.stopped_by) == (1, "Ctrl-C")


def test_with_no_round_finished_the_error_goes_up():
    _, one_round = rounds_failing_at(1, RuntimeError("baseline failed"))
    with pytest.raises(RuntimeError, match="baseline failed"):
        run_rounds(3, one_round, lambda k: None)


def test_a_round_cut_short_is_dropped_whole_so_pairs_stay_same_run():
    # 2 thread counts per round; round 3 stopped after Pyrsia's first run at the first count
    runs = {
        "pyrsia": [{"r": i} for i in range(5)],
        "baseline": [{"r": i} for i in range(4)],
        "torchrec": [{"r": i} for i in range(4)],
    }
    kept = finished_rounds(runs, rounds=2, runs_per_round=2)
    assert {side: [r["r"] for r in v] for side, v in kept.items()} == {
        "pyrsia": [0, 1, 2, 3],
        "baseline": [0, 1, 2, 3],
        "torchrec": [0, 1, 2, 3],
    }
    assert len(runs["pyrsia"]) == 5  # the caller's runs are left as they were
