"""``hb.metrics``: streaming AUC and accuracy that are correct across ranks and steps.

Each metric accumulates batches on its rank (``update``) and combines the ranks when
asked (``result``), so every rank gets the value of the union of all ranks' data:

- :class:`AUC` (``num_thresholds=None``, the default): exact ROC AUC. Each rank keeps
  its (score, label) pairs, scores in float64; ``result()`` all-gathers them and ranks
  them, ties at their average rank (the Mann-Whitney statistic, what
  ``sklearn.metrics.roc_auc_score`` computes). Memory: 9 bytes per evaluated sample.
  Pyrsia's addition: HybridBackend's ``auc`` is the bucketed one below.
- :class:`AUC` with ``num_thresholds=T``: HybridBackend's bucketed AUC. Each rank keeps
  positive/negative counts per score bucket; ``result()`` sums the histograms
  (all-reduce) and integrates the ROC curve by trapezoids. Constant memory; the error
  is bounded by the pairs falling in one bucket.
- :class:`Accuracy`: correct and total counts, summed over the ranks. By default it
  compares class ids for equality, as HybridBackend's ``accuracy`` does; with
  ``threshold=t`` it scores binary predictions ``p > t`` against 0/1 labels.

Shapes follow TF's metrics (HybridBackend's are TF metrics): a trailing dimension of 1
on either side is dropped (``(B, 1)`` predictions against ``(B,)`` labels), then labels
and predictions must have one shape; anything else is refused, naming the argument.
AUC labels and thresholded-accuracy labels must be 0 or 1 (TF would cast any non-zero
label to true; here a label of 0.3 or -1 is refused instead).

The functional forms :func:`auc` and :func:`accuracy` behave as HybridBackend's TF
metrics: inside an evaluation (``hb.train.EvaluationHook`` / ``train_and_evaluate``'s
``eval_fn``) each call site (or each ``name=``) is one metric that accumulates every
update since the evaluation began, over the ``eval_steps`` calls of ``eval_fn`` or over
a loop inside one call; outside an evaluation each call returns a fresh metric holding
its one batch. See :class:`Evaluation`.

Several ranks (``WORLD_SIZE > 1``) join the process group on the first ``result()`` if
no one did before, so a metric never returns a rank-local value by mistake.
"""

from __future__ import annotations

import contextvars
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from persia.hb._metric_inputs import aligned, binary, check_class_ids
from persia.hb._metric_ranks import all_gather_1d, device, distributed
from pyrsia.shared.errors import InvalidInputError

__all__ = ["AUC", "Accuracy", "Evaluation", "accuracy", "auc", "evaluate", "roc_auc"]


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney, ties at average rank, float64); NaN without both classes."""
    y = np.asarray(labels).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    positives = int(y.sum())
    negatives = y.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]
    return float((ranks[y].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


class AUC:
    """Streaming ROC AUC over every rank's batches (see the module docstring).

    ``update(labels, predictions)``: labels 0 or 1, predictions any finite scores
    (in [0, 1] when bucketed), one shape up to a trailing 1. Exact mode keeps scores in
    float64 (a float32 copy would tie scores closer than 6e-8 and change the AUC).
    """

    def __init__(self, num_thresholds: int | None = None):
        if num_thresholds is not None and (
            isinstance(num_thresholds, bool)
            or not isinstance(num_thresholds, int)
            or num_thresholds < 2
        ):
            raise InvalidInputError(
                "num_thresholds", "None (exact) or an integer >= 2", num_thresholds
            )
        self.num_thresholds = num_thresholds
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far (start a new evaluation)."""
        self._scores: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        buckets = self.num_thresholds or 1
        self._hist = np.zeros((2, buckets), dtype=np.float64)  # [negatives, positives]

    def update(self, labels: Any, predictions: Any) -> None:
        """Add one batch: labels 0 or 1, predictions (scores; in [0, 1] when bucketed)."""
        y, p = aligned(labels, predictions)
        positive = binary(y)
        p = p.astype(np.float64, copy=False)
        if self.num_thresholds is None:
            self._scores.append(p)
            self._labels.append(positive)
            return
        if p.size and (p.min() < 0 or p.max() > 1):
            raise InvalidInputError(
                "predictions", "scores in [0, 1] for a bucketed AUC", float(p.min())
            )
        bucket = np.minimum((p * self.num_thresholds).astype(np.int64), self.num_thresholds - 1)
        np.add.at(self._hist, (positive.astype(np.int64), bucket), 1.0)

    def result(self) -> float:
        """The AUC of every rank's batches (a collective call: every rank must make it)."""
        if self.num_thresholds is None:
            scores = np.concatenate(self._scores) if self._scores else np.zeros(0, np.float64)
            labels = np.concatenate(self._labels) if self._labels else np.zeros(0, bool)
            if distributed():
                scores = all_gather_1d(scores, torch.float64)
                labels = all_gather_1d(labels.astype(np.uint8), torch.uint8).astype(bool)
            return roc_auc(labels, scores)
        hist = self._hist
        if distributed():
            tensor = torch.as_tensor(hist, device=device())
            dist.all_reduce(tensor)
            hist = tensor.cpu().numpy()
        negatives, positives = hist[0][::-1], hist[1][::-1]  # descending score buckets
        tp = np.concatenate(([0.0], np.cumsum(positives)))
        fp = np.concatenate(([0.0], np.cumsum(negatives)))
        if tp[-1] == 0 or fp[-1] == 0:
            return float("nan")
        return float(np.trapezoid(tp / tp[-1], fp / fp[-1]))


class Accuracy:
    """Streaming accuracy, summed over the ranks.

    ``threshold=None`` (the default): HybridBackend's ``hb.metrics.accuracy``, the share
    of predictions equal to their labels (hybridbackend/tensorflow/metrics/accuracy.py:
    ``equal(predictions, labels)`` after TF's shape check, no threshold). Both must be
    class ids (whole numbers); probabilities and logits are refused rather than compared
    (HB would cast them to the labels' dtype and count ``0.9 == 1`` as wrong): pass
    ``logits.argmax(-1)`` for several classes. Labels and predictions of one rank-2
    shape compare element by element, as in HB.

    ``threshold=t`` (Pyrsia's addition, Keras' ``binary_accuracy``): labels must be 0
    or 1, and a prediction counts as positive when ``p > t``.
    """

    def __init__(self, threshold: float | None = None):
        if threshold is not None and (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not math.isfinite(threshold)
        ):
            raise InvalidInputError(
                "threshold",
                "None (compare class ids) or a finite number (binary scores: p > threshold)",
                threshold,
            )
        self.threshold = None if threshold is None else float(threshold)
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far (start a new evaluation)."""
        self._counts = np.zeros(2, dtype=np.float64)  # [correct, total]

    def update(self, labels: Any, predictions: Any) -> None:
        """Add one batch (see the class docstring for what each mode accepts)."""
        y, p = aligned(labels, predictions)
        if self.threshold is None:
            check_class_ids(p, "predictions")
            check_class_ids(y, "labels")
            correct = y == p
        else:
            correct = (p > self.threshold) == binary(y)
        self._counts += correct.sum(), y.size

    def result(self) -> float:
        """Correct / total over every rank's batches (collective); NaN before any batch."""
        counts = self._counts
        if distributed():
            tensor = torch.as_tensor(counts, device=device())
            dist.all_reduce(tensor)
            counts = tensor.cpu().numpy()
        return float(counts[0] / counts[1]) if counts[1] else float("nan")


Metric = TypeVar("Metric", AUC, Accuracy)

_current: contextvars.ContextVar[Evaluation | None] = contextvars.ContextVar(
    "persia_hb_evaluation", default=None
)


class Evaluation:
    """The functional metrics of one evaluation: what TF's metric variables are in HB.

    HybridBackend's ``hb.metrics.auc(labels, predictions)`` is a TF metric: built once,
    it is an update op and a value over every update since its variables were
    initialized, and ``hb.train.EvaluationHook(fn, steps=k)`` runs the update op ``k``
    times before reading the value (hybridbackend/tensorflow/training/evaluation.py,
    ``EvaluationHook._evaluate``). Eager torch runs ``eval_fn`` again at each step, so
    here the functional :func:`auc` / :func:`accuracy` find their accumulator in the
    evaluation under way: one metric per ``name=``, or without a name per call site
    (the line and instruction that calls it), created at its first call in the
    evaluation and updated by every later one. Each evaluation starts from zero.

    Refused, because the value would silently cover less than the evaluation: one
    unnamed call site reached twice within one step of a ``steps`` evaluation (two
    heads in a loop: give each a ``name=``), and one name or site used for two kinds or
    settings of metric.
    """

    def __init__(self, steps: int | None = None):
        self.steps = steps
        self._metrics: dict[tuple[Any, ...], AUC | Accuracy] = {}
        self._configs: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._sites_this_step: set[tuple[Any, ...]] = set()
        self._token: contextvars.Token | None = None

    def __enter__(self) -> Evaluation:
        self._token = _current.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None

    def next_step(self) -> None:
        """Mark the start of one more ``eval_fn`` call (one batch) of this evaluation."""
        self._sites_this_step.clear()

    def metric(
        self, key: tuple[Any, ...], where: str, config: tuple[Any, ...], make: Callable[[], Metric]
    ) -> Metric:
        """The evaluation's metric under ``key`` (made on first use)."""
        if key[0] == "site" and self.steps is not None:
            if key in self._sites_this_step:
                raise InvalidInputError(
                    "name",
                    f"a distinct name= for each functional metric called more than once in "
                    f"one evaluation step at {where} (each call there would feed one metric)",
                    None,
                )
            self._sites_this_step.add(key)
        existing = self._metrics.get(key)
        if existing is None:
            self._metrics[key], self._configs[key] = make(), config
            return self._metrics[key]  # type: ignore[return-value]
        if self._configs[key] != config:
            raise InvalidInputError(
                "name",
                f"one kind and setting of metric per name or call site ({where})",
                f"{config} after {self._configs[key]}",
            )
        return existing  # type: ignore[return-value]


def _functional(name: str | None, config: tuple[Any, ...], make: Callable[[], Metric]) -> Metric:
    if name is not None and (not isinstance(name, str) or not name):
        raise InvalidInputError("name", "a non-empty string or None", name)
    evaluation = _current.get()
    if evaluation is None:
        return make()
    if name is not None:
        return evaluation.metric(("name", name), repr(name), config, make)
    caller = sys._getframe(2)  # the frame calling auc() / accuracy()
    where = f"{caller.f_code.co_filename}:{caller.f_lineno}"
    return evaluation.metric(("site", caller.f_code, caller.f_lasti), where, config, make)


def auc(
    labels: Any, predictions: Any, *, num_thresholds: int | None = None, name: str | None = None
) -> AUC:
    """HybridBackend's ``hb.metrics.auc``: update the evaluation's :class:`AUC` with a batch.

    Inside an evaluation the returned metric accumulates every call from this call site
    (or with this ``name``) since the evaluation began; outside one it is a fresh metric
    holding this batch (see :class:`Evaluation`). ``num_thresholds=None`` (exact) is
    Pyrsia's default; HB's is 200 buckets. Settings are keyword-only: HB's third
    positional argument is ``weights``, which Pyrsia does not take, so a call ported
    with one is refused instead of read as a setting.
    """
    metric = _functional(name, ("auc", num_thresholds), lambda: AUC(num_thresholds))
    metric.update(labels, predictions)
    return metric


def accuracy(
    labels: Any, predictions: Any, *, threshold: float | None = None, name: str | None = None
) -> Accuracy:
    """HybridBackend's ``hb.metrics.accuracy``: update the evaluation's :class:`Accuracy`.

    Class ids compared for equality (``threshold=None``), or binary scores ``p >
    threshold`` against 0/1 labels; accumulation and keyword-only settings as for
    :func:`auc`.
    """
    metric = _functional(name, ("accuracy", threshold), lambda: Accuracy(threshold))
    metric.update(labels, predictions)
    return metric


def evaluate(eval_fn: Callable[[], Any], steps: int | None = None) -> dict[str, float]:
    """Run one evaluation: ``eval_fn()`` once, or ``steps`` times; return its values.

    ``steps=None``: ``eval_fn`` evaluates the whole set itself (a loop over its batches).
    ``steps=k``: HybridBackend's form, ``eval_fn`` evaluates one batch per call and is
    called ``k`` times; the functional metrics accumulate over the ``k`` calls. The
    answer of the last call (a dict of name -> metric or number) is turned into values,
    metrics by their ``result()`` (which combines all ranks), numbers as they are (a
    number is the last step's). Refused: an ``eval_fn`` that runs out of data before
    step ``k`` (``StopIteration``), and one that answers a new metric object at each
    step (it would hold the last batch only). A metric object made outside ``eval_fn``
    and updated in it is the user's: it keeps accumulating across evaluations until its
    ``reset()``.

    Where Pyrsia differs from HB's ``EvaluationHook(fn, steps=100, ...)``: the default
    is ``None``, and ``None`` means one call that evaluates everything (HB: one batch per
    call until the evaluation data ends); ``eval_fn`` answers metrics and numbers
    rather than HB's ``(update_op, metrics, hooks)``.
    """
    with Evaluation(steps) as evaluation:
        answer: Any = None
        held: dict[str, Any] = {}
        for step in range(1 if steps is None else steps):
            evaluation.next_step()
            if steps is None:
                answer = eval_fn()
            else:
                try:
                    answer = eval_fn()
                except StopIteration as exc:
                    raise InvalidInputError(
                        "steps",
                        f"at most the {step} batches the evaluation data has (eval_fn() "
                        f"raised StopIteration at step {step + 1})",
                        steps,
                    ) from exc
            if not isinstance(answer, dict):
                raise InvalidInputError(
                    "eval_fn()", "a dict of name -> metric or number", type(answer).__name__
                )
            for key, value in answer.items():
                if not hasattr(value, "result"):
                    continue
                if key in held and held[key] is not value:
                    raise InvalidInputError(
                        "eval_fn()",
                        f"the same metric object for {key!r} at each of the {steps} steps (a "
                        f"metric made inside eval_fn holds only its own step's batch: use "
                        f"hb.metrics.auc()/accuracy(), which accumulate over the steps and "
                        f"start from zero at each evaluation)",
                        f"a new metric object at step {step + 1}",
                    )
                held[key] = value
        return {
            str(name): float(v.result() if hasattr(v, "result") else v)
            for name, v in answer.items()
        }
