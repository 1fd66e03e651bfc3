"""What one NN-worker rank's training loop has done: the state its observers read.

``TrainCtx.backward`` records each step here with a few attribute writes (no lock, no
allocation but the loss reference every ``loss_every`` steps: about a microsecond), and the
prefetcher adds the time the loop waited for its next looked-up batch. Everything that
shows the rank reads it from another thread, never on the training thread:

* the ingress' ``GET /metrics`` (and the push gateway), at scrape time
  (:func:`register_rank_metrics`);
* the TensorBoard writer thread (``pyrsia.services.nn_worker.tensorboard``).

Counters only grow; readers take differences. The loss is kept as the detached tensor
passed to ``ctx.backward`` (every ``loss_every`` steps), so reading it as a float, which
waits for the GPU, happens on the reader's thread; on a GPU a CUDA event recorded after it
lets ``/metrics`` show the previous loss instead of waiting on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import prometheus_client as prom
import torch
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from pyrsia.services.nn_worker.step_clock import StepClock
from pyrsia.shared.constants import RATE_WINDOW_S, STALLED_S

__all__ = ["RankStats", "register_rank_metrics"]


PHASES = ("autograd", "gradient_send", "dense_step")
"""The phases of ``TrainCtx.backward`` the step clock times."""


class RankStats:
    """Cumulative counters of one rank's training, written by the training thread."""

    def __init__(self, loss_every: int = 1) -> None:
        self.loss_every = loss_every
        self.steps = 0
        """Training steps taken (restored steps included after ``--resume``)."""
        self.samples = 0
        self.skipped_updates = 0
        """Steps whose embedding update was skipped: non-finite embedding gradients."""
        self.loss_scale = 1.0
        self.lookup_wait_s = 0.0
        """Seconds the loop waited for its next looked-up batch (training DataLoaders)."""
        self.lookups_taken = 0
        self.sample: tuple[int, torch.Tensor, torch.cuda.Event | None] | None = None
        """``(step, detached loss, CUDA event recorded after it or None)`` of the last
        sampled loss: one attribute, so a reader never pairs one step's loss with another's."""
        self._read: tuple[int, float] | None = None  # the last loss a reader turned into a float
        self.samples_per_s = 0.0
        """Samples per second over the last :data:`RATE_WINDOW_S` or more."""
        self.clock: StepClock | None = None
        self.in_flight: Callable[[], int] = lambda: 0
        """Batches whose embedding gradients are still being sent (the staleness)."""
        self.started = time.time()
        self._window_t = time.perf_counter()
        self._window_samples = 0
        self.last_step_at = self._window_t
        """``time.perf_counter()`` when the last step finished."""

    def step_done(
        self, step: int, batch_size: int, loss: torch.Tensor, scale: float, finite: bool
    ) -> bool:
        """One training step (training thread); True when its loss was sampled."""
        self.steps = step
        self.samples += batch_size
        self.loss_scale = scale
        if not finite:
            self.skipped_updates += 1
        now = self.last_step_at = time.perf_counter()
        if now - self._window_t >= RATE_WINDOW_S:
            self.samples_per_s = (self.samples - self._window_samples) / (now - self._window_t)
            self._window_t, self._window_samples = now, self.samples
        if step % self.loss_every:
            return False
        ready = None
        if loss.is_cuda:  # /metrics reads the loss once the GPU got past this marker
            ready = torch.cuda.Event()
            ready.record()
        self.sample = (step, loss.detach(), ready)
        return True

    def waited(self, seconds: float) -> None:
        """The training loop waited ``seconds`` for a looked-up batch (training thread)."""
        self.lookup_wait_s += seconds
        self.lookups_taken += 1

    def samples_rate(self) -> float:
        """Samples/s over the last window; 0 when no step finished for ``STALLED_S``."""
        if time.perf_counter() - self.last_step_at > STALLED_S:
            return 0.0
        return self.samples_per_s

    def last_loss(self, wait: bool = False) -> float | None:
        """The last sampled loss as a float (call off the training thread). On a GPU, with
        ``wait=False``, a loss the GPU has not computed yet is not waited for: the previous
        one read is returned (None before any)."""
        sample = self.sample
        if sample is None:
            return None
        step, loss, ready = sample
        read = self._read
        if read is not None and read[0] == step:
            return read[1]
        if ready is not None and not wait and not ready.query():
            return None if read is None else read[1]
        value = float(loss)
        self._read = (step, value)
        return value

    def phase_seconds(self) -> dict[str, float]:
        """Cumulative wall seconds per step phase."""
        return dict(self.clock.wall) if self.clock is not None else {}


def register_rank_metrics(stats: RankStats, registry: prom.CollectorRegistry) -> None:
    """Expose ``stats`` on ``registry``; every value is read at scrape time (one literal
    ``prom.Gauge`` or ``CounterMetricFamily`` per metric, so docs/gen_reference.py lists each;
    the cumulative series are counters, exposed with ``_total``)."""
    r = registry
    prom.Gauge(
        "pyrsia_nn_worker_steps",
        "training steps this rank has taken (counting those restored by --resume)",
        registry=r,
    ).set_function(lambda: stats.steps)
    prom.Gauge(
        "pyrsia_nn_worker_samples_per_second",
        "samples/s of this rank over the last second or more",
        registry=r,
    ).set_function(stats.samples_rate)
    prom.Gauge(
        "pyrsia_nn_worker_gradients_in_flight",
        "batches whose embedding gradients are being sent (the embedding staleness)",
        registry=r,
    ).set_function(lambda: stats.in_flight())
    prom.Gauge(
        "pyrsia_nn_worker_loss_scale", "the loss scale of the last step (1 without AMP)", registry=r
    ).set_function(lambda: stats.loss_scale)
    prom.Gauge(
        "pyrsia_nn_worker_loss", "the last sampled training loss (NaN before the first)", registry=r
    ).set_function(lambda: _or_nan(stats.last_loss()))
    r.register(_RankCounters(stats))


class _RankCounters(Collector):
    """The rank's cumulative series, typed counter (``rate()`` then sees a restarted rank's
    reset as one), read from its :class:`RankStats` at each scrape."""

    def __init__(self, stats: RankStats):
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        s = self.stats
        yield CounterMetricFamily(
            "pyrsia_nn_worker_samples", "samples trained by this rank", value=s.samples
        )
        yield CounterMetricFamily(
            "pyrsia_nn_worker_lookup_wait_seconds",
            "seconds the training loop waited for its next looked-up batch",
            value=s.lookup_wait_s,
        )
        yield CounterMetricFamily(
            "pyrsia_nn_worker_skipped_embedding_updates",
            "steps whose embedding update was skipped for non-finite gradients",
            value=s.skipped_updates,
        )
        phases = CounterMetricFamily(
            "pyrsia_nn_worker_step_phase_seconds",
            "wall seconds of TrainCtx.backward's phases",
            labels=["phase"],
        )
        seconds = s.phase_seconds()
        for phase in PHASES:
            phases.add_metric([phase], seconds.get(phase, 0.0))
        yield phases


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
