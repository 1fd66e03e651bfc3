"""``hb.train``'s evaluations as TensorBoard curves.

With ``PERSIA_TENSORBOARD_DIR`` set, every evaluation of :class:`persia.hb.train.EvaluationHook`
(and so of ``train_and_evaluate``) adds ``eval/<name>`` scalars at its step to the job's run
directory, ``<dir>/<PERSIA_JOB_ID>/rank_<r>/``, the layout and tag scheme of
``TrainCtx(tensorboard_dir=...)``. Only the chief writes: ``hb.metrics`` results already
combine every rank. An evaluation is rare, so the write is synchronous.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pyrsia.services.nn_worker.tensorboard import run_dir
from pyrsia.shared.constants import ENV_TENSORBOARD_DIR
from pyrsia.shared.settings import Settings

__all__ = ["EvalCurves"]


class EvalCurves:
    """Writes ``eval/<name>`` scalars of one rank's evaluations with TensorBoard's writer."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self._writer = None

    @classmethod
    def from_env(cls, rank: int, settings: Settings) -> EvalCurves | None:
        """The curves of ``rank`` when ``PERSIA_TENSORBOARD_DIR`` is set in ``settings``; else
        None."""
        root = settings.text(ENV_TENSORBOARD_DIR)
        if not root:
            return None
        return cls(run_dir(root, settings.job_id, rank))

    def write(self, step: int, values: Mapping[str, float]) -> None:
        """One point per value at ``step``, flushed to disk at once."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.directory))
        for name, value in values.items():
            self._writer.add_scalar(f"eval/{name}", float(value), step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
