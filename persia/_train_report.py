"""What a training rank reports while its ``TrainCtx`` is entered: :class:`RankReport`.

Its statistics (steps, samples, loss, waits) are what the rank's ``/metrics`` serves; with a
TensorBoard directory they are also drawn as curves. The TensorBoard run lives in ``<dir>/<PERSIA_JOB_ID>/rank_<r>`` (``dir``: the argument, else
``$PERSIA_TENSORBOARD_DIR``; neither: no curves). Rank 0 also draws the embedding PS's curves
when it reaches them through the registry. Tags: ``pyrsia.services.nn_worker.tensorboard``.
"""

from __future__ import annotations

import os

from persia._train_args import check_scalar
from pyrsia.services.nn_worker.ps_curves import PSCurves
from pyrsia.services.nn_worker.rank_stats import RankStats
from pyrsia.services.nn_worker.step import HookHandle, StepEvent, TrainingStep
from pyrsia.services.nn_worker.tensorboard import TensorBoardLog, run_dir
from pyrsia.shared.constants import ENV_TENSORBOARD_DIR
from pyrsia.shared.registry import RegistrySettings
from pyrsia.shared.settings import Settings


def start_tensorboard(
    tensorboard_dir: str | os.PathLike | None,
    rank_id: int,
    stats: RankStats,
    settings: RegistrySettings | None,
    has_scaler: bool,
    env: Settings,
) -> TensorBoardLog | None:
    """This rank's curves of ``stats``, their writer started; None when no directory is set.

    ``settings``: the job's registry (None with addresses or in embedded mode: no PS curves);
    ``env``: the context's settings (``PERSIA_TENSORBOARD_DIR``, the job id).
    """
    root = tensorboard_dir or env.text(ENV_TENSORBOARD_DIR) or None
    if root is None:
        return None
    job_id = env.job_id
    ps = PSCurves(settings) if rank_id == 0 and settings is not None else None
    log = TensorBoardLog(run_dir(root, job_id, rank_id), stats, has_scaler=has_scaler, ps=ps)
    log.start()
    return log


class RankReport:
    """A rank's statistics and TensorBoard curves, both fed by one ``step_boundary`` hook."""

    def __init__(self) -> None:
        self.stats: RankStats | None = None
        self.tensorboard: TensorBoardLog | None = None

    def start(
        self,
        stats: RankStats,
        step: TrainingStep,
        *,
        loss_every: int,
        tensorboard_dir: str | os.PathLike | None,
        rank_id: int,
        settings: RegistrySettings | None,
        environment: Settings,
    ) -> HookHandle:
        """Feed ``stats`` (and the curves, when a directory is set) from ``step``; the hook's
        handle. Call it after the checkpoint's hook: ``/metrics`` shows a step once complete."""
        stats.loss_every = loss_every
        stats.clock = step.clock
        stats.steps = step.steps  # restored by --resume
        engine = step.gradients
        stats.in_flight = lambda: engine.in_flight
        self.stats = stats
        has_scaler = step.precision.scaler is not None
        self.tensorboard = start_tensorboard(
            tensorboard_dir, rank_id, stats, settings, has_scaler, environment
        )
        return step.add_hook("step_boundary", self.record_step)

    def record_step(self, event: StepEvent) -> None:
        """The ``step_boundary`` hook of the rank's statistics and TensorBoard curves."""
        batch_size = event.batch.batch_size
        if self.stats.step_done(event.step, batch_size, event.loss, event.scale, event.finite):
            if self.tensorboard is not None:
                self.tensorboard.record_step()

    def log_scalar(self, tag: str, value: object, step: int) -> None:
        """One scalar at ``step`` in the TensorBoard run; nothing without one."""
        check_scalar(tag, value)
        if self.tensorboard is not None:
            self.tensorboard.log_scalar(tag, value, step)

    def close(self) -> None:
        """The curves' writer closed (it writes what is left); the statistics stay."""
        tensorboard, self.tensorboard = self.tensorboard, None
        if tensorboard is not None:
            tensorboard.close()
