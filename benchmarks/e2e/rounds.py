"""The end-to-end benchmark's rounds, kept when a run stops part-way.

``e2e_bench.py`` runs every side ``--repeats`` times, one round after another, and an
11-minute run that is stopped (Ctrl-C, a side that fails, a machine that goes away) used to
lose every number. Here each finished round is written to the JSON file at once (marked
``"partial": true`` with the number of rounds done), and a run stopped part-way summarizes
the rounds that finished (a round cut short is dropped whole, so each pair stays a same-run
pair) and says so, instead of ending with nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Runs = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class RoundsDone:
    """How a data set's rounds ended: ``done`` of ``planned`` finished, and why the rest did
    not run (``stopped_by``: empty when every round ran)."""

    done: int
    planned: int
    stopped_by: str = ""

    @property
    def complete(self) -> bool:
        """Whether every planned round finished."""
        return self.done == self.planned and not self.stopped_by

    def note(self) -> dict[str, Any]:
        """The result's ``rounds`` field: what ran, for the JSON and the report."""
        return {"done": self.done, "planned": self.planned, "stopped_by": self.stopped_by}


def finished_rounds(runs: Runs, rounds: int, runs_per_round: int) -> Runs:
    """``runs`` cut to the first ``rounds`` whole rounds: every side keeps
    ``rounds * runs_per_round`` runs, so a round cut short leaves no unpaired run behind."""
    keep = rounds * runs_per_round
    return {side: list(side_runs[:keep]) for side, side_runs in runs.items()}


def run_rounds(
    planned: int,
    one_round: Callable[[], None],
    after_round: Callable[[int], None],
) -> RoundsDone:
    """Run ``one_round`` ``planned`` times, calling ``after_round(k)`` after the k-th.

    Ctrl-C or a failing round stops the loop; with at least one round finished, the stop is
    reported in the answer (and printed by the caller) instead of raised, so the finished
    rounds still reach the report. With none finished, the error goes up as it came.
    """
    done = 0
    try:
        for _ in range(planned):
            one_round()
            done += 1
            after_round(done)
    except (KeyboardInterrupt, Exception) as exc:  # noqa: BLE001 - reported, rounds kept
        if done == 0:
            raise
        reason = "Ctrl-C" if isinstance(exc, KeyboardInterrupt) else f"{type(exc).__name__}: {exc}"
        return RoundsDone(done, planned, reason)
    return RoundsDone(done, planned)
