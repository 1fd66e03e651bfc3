"""Training curves: TensorBoard scalars of one NN-worker rank, written off the training thread.

``TrainCtx(tensorboard_dir=D)`` (or ``PERSIA_TENSORBOARD_DIR=D``) writes one run per rank
of each job, ``D/<PERSIA_JOB_ID>/rank_<r>/``, with TensorBoard's own event writer
(``torch.utils.tensorboard.SummaryWriter``). Tags, at the step numbers of
``TrainCtx.backward`` (1 for the first step)::

    train/loss                   the loss passed to ctx.backward, every `log_every_n_steps`
                                 (default 1: every step)
    train/embedding_staleness    batches whose embedding gradients were in flight then
    eval/<name>, <any>/<name>    what the script logs: ctx.log_scalar("eval/auc", auc)

and, once a second (``FLUSH_INTERVAL_S``) at the last step taken, what happened since the
previous point::

    train/samples_per_second     samples/s of this rank
    train/lookup_wait_ms         mean wait of the loop for its next looked-up batch, per step
    train/dense_step_ms          mean dense optimizer step (+ zero_grad), per step
    train/backward_ms            mean autograd (loss.backward()) time, per step
    train/skipped_embedding_updates   steps skipped so far for non-finite gradients
    train/loss_scale             the AMP loss scale (only when a GradScaler runs)

and, on rank 0 only, the PS side of the job, read from the ``/metrics`` of the PS replicas
registered for the job (pyrsia/services/nn_worker/ps_curves.py) as the writer starts, every
``PS_POLL_INTERVAL_S`` (10 s) and once at close, at the last step taken::

    ps/entries                   embedding entries held, summed over the PS replicas
    ps/hit_rate                  training-lookup ids found stored / ids looked up, since the
                                 previous point (0 to 1)
    ps/admit_rate                ids given a new entry per second, since the previous point
    ps/evict_rate                entries evicted for capacity per second, since the previous point

A replica that does not answer within 2 s is left out of that point (one debug log line);
the poll runs on the writer thread, so it never holds up the training loop.

The training thread only appends a tuple to a deque for each sampled loss (and each
``log_scalar``); the writer thread turns them into events (a ``SummaryWriter.add_scalar``
costs about 0.1 ms of CPU) and reads the loss as a
float there, so on a GPU the sync is not the loop's.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from pyrsia.services.nn_worker import ps_curves
from pyrsia.services.nn_worker.rank_stats import RankStats
from pyrsia.shared.constants import MAX_PENDING_CURVE_POINTS as MAX_PENDING
from pyrsia.shared.constants import TENSORBOARD_FLUSH_INTERVAL_S as FLUSH_INTERVAL_S
from pyrsia.shared.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["TensorBoardLog", "run_dir"]


def run_dir(root: str | os.PathLike, job_id: str, rank: int) -> Path:
    """The run directory of ``rank`` of job ``job_id`` under ``root``."""
    return Path(root) / job_id / f"rank_{rank}"


class TensorBoardLog:
    """Records a rank's scalars on the training thread; a thread writes them as events."""

    def __init__(
        self,
        directory: str | os.PathLike,
        stats: RankStats,
        *,
        has_scaler: bool,
        ps: ps_curves.PSCurves | None = None,
    ):
        """``ps``: where to read the PS curves from (rank 0 of a job with a registry), else
        None (no ``ps/*`` tags)."""
        self.directory = Path(directory)
        self.ps = ps
        self.stats = stats
        self.has_scaler = has_scaler
        self._pending: deque[tuple] = deque(maxlen=MAX_PENDING)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: tuple[float, int, int, float, dict[str, float]] | None = None
        self._started = time.perf_counter()
        self._first_step = stats.steps
        self.failed: BaseException | None = None

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        """Create the run directory (ConfigError if it cannot be) and start the writer."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"tensorboard_dir: cannot create {self.directory}: {exc}; pass a writable "
                "directory (TrainCtx(tensorboard_dir=...) or PERSIA_TENSORBOARD_DIR)"
            ) from exc
        self._started, self._first_step = time.perf_counter(), self.stats.steps
        self._thread = threading.Thread(target=self._run, name="tensorboard", daemon=True)
        self._thread.start()
        log.info("TensorBoard scalars in %s", self.directory)

    def close(self) -> None:
        """Write what is left, close the event file and join the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        self._wake.set()
        thread.join()

    # --- training thread -----------------------------------------------------------------
    def record_step(self) -> None:
        """Take this step's loss point (the stats' last sampled loss) and the gradients in
        flight: one append."""
        if self.failed is not None:  # no writer: keep no tensors
            return
        s = self.stats
        step, loss, _ = s.sample
        self._pending.append(("loss", step, loss, time.time(), s.in_flight()))

    def log_scalar(self, tag: str, value: Any, step: int) -> None:
        """One scalar of the script's (an eval AUC); ``value`` may be a tensor (read later)."""
        if self.failed is not None:
            return
        self._pending.append(("scalar", step, tag, value, time.time()))

    # --- writer thread -------------------------------------------------------------------
    def _run(self) -> None:
        writer = None
        try:
            first = self._poll_ps()  # the PS counters as the job starts, before a 2 s import
            from torch.utils.tensorboard import SummaryWriter  # ~2 s import: off the loop

            writer = SummaryWriter(log_dir=str(self.directory))
            self._write_ps(writer, first)
            polled = time.monotonic()
            while not self._stop.is_set():
                self._wake.wait(self._wait_s(polled))
                self._wake.clear()
                self._drain(writer)
                if (
                    self.ps is not None
                    and time.monotonic() - polled >= ps_curves.PS_POLL_INTERVAL_S
                ):
                    self._write_ps(writer, self._poll_ps())
                    polled = time.monotonic()
                writer.flush()
            self._drain(writer)
            self._write_ps(writer, self._poll_ps())
        except Exception as exc:  # reported once; training goes on without curves
            self.failed = exc
            self._pending.clear()
            log.warning("TensorBoard writer stopped, no more curves: %s", exc)
        finally:
            if writer is not None:
                writer.close()

    def _wait_s(self, polled: float) -> float:
        """Until the next flush or the next PS point, whichever comes first."""
        if self.ps is None:
            return FLUSH_INTERVAL_S
        due = polled + ps_curves.PS_POLL_INTERVAL_S - time.monotonic()
        return max(min(FLUSH_INTERVAL_S, due), 0.0)

    def _poll_ps(self) -> tuple[int, float, dict[str, float]]:
        """The ``ps/*`` values of this moment, at the last step taken (none without ``ps``)."""
        if self.ps is None:
            return 0, 0.0, {}
        return self.stats.steps, time.time(), self.ps.poll()

    @staticmethod
    def _write_ps(writer, point: tuple[int, float, dict[str, float]]) -> None:
        step, wall, values = point
        for tag, value in values.items():
            writer.add_scalar(tag, value, step, walltime=wall)

    def _drain(self, writer) -> None:
        """Write the recorded points, then the rates since the last drain at the last step."""
        while self._pending:
            record = self._pending.popleft()
            if record[0] == "scalar":
                _, step, tag, value, wall = record
            else:
                _, step, value, wall, in_flight = record
                tag = "train/loss"
                writer.add_scalar("train/embedding_staleness", in_flight, step, walltime=wall)
            writer.add_scalar(tag, float(value), step, walltime=wall)
        self._write_rates(writer)

    def _snapshot(self) -> tuple[float, int, int, float, dict[str, float]]:
        s = self.stats
        # the last step's time, not now: a pause after it (an evaluation) is no slower rate
        return s.last_step_at, s.steps, s.samples, s.lookup_wait_s, s.phase_seconds()

    def _write_rates(self, writer) -> None:
        now = self._snapshot()
        previous, self._previous = self._previous, now
        clock, step, samples, wait_s, phases = now
        if previous is None:  # the counters as the context was entered (after a --resume)
            previous = (self._started, self._first_step, 0, 0.0, {})
        clock0, step0, samples0, wait0, phases0 = previous
        steps = step - step0
        if steps <= 0:
            self._previous = previous  # nothing new: the next rates start from there
            return
        s, wall = self.stats, time.time()

        def add(tag: str, value: float) -> None:
            writer.add_scalar(tag, value, step, walltime=wall)

        add("train/samples_per_second", (samples - samples0) / max(clock - clock0, 1e-9))
        add("train/lookup_wait_ms", (wait_s - wait0) / steps * 1e3)
        for phase, tag in (("dense_step", "dense_step_ms"), ("autograd", "backward_ms")):
            if phase in phases:
                add(f"train/{tag}", (phases[phase] - phases0.get(phase, 0.0)) / steps * 1e3)
        add("train/skipped_embedding_updates", s.skipped_updates)
        if self.has_scaler:
            add("train/loss_scale", s.loss_scale)
