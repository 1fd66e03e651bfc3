"""``hb.train``: the training-loop helper with periodic evaluation, and export.

::

    def eval_fn():
        auc, acc = hb.metrics.AUC(), hb.metrics.Accuracy(threshold=0.5)
        with torch.no_grad():
            for x, y in hb.data.make_one_shot_iterator(eval_set, 1024, drop_remainder=False):
                p = model(x)
                auc.update(y, p); acc.update(y, p)
        return {"auc": auc, "accuracy": acc}      # metrics (or plain numbers)

    history = hb.train.train_and_evaluate(step_fn, train_iterator,
                                          eval_fn=eval_fn, eval_every_n_iter=100)

``eval_fn`` runs on every rank after every ``eval_every_n_iter`` steps and once at the
end (HybridBackend's ``EvaluationHook``); metric objects in its answer are turned into
values with their ``result()``, which combines all ranks. With ``eval_steps=k``
(HybridBackend's ``steps``) ``eval_fn`` evaluates one batch per call and is called ``k``
times per evaluation; ``hb.metrics.auc``/``accuracy`` called in it accumulate over the
``k`` batches (see ``hb.metrics.evaluate``). ``history`` lists
``(step, {name: value})``; rank 0 logs each evaluation and, with
``PERSIA_TENSORBOARD_DIR`` set, adds it to the job's TensorBoard run as ``eval/<name>``
(the run directory and tags of ``TrainCtx(tensorboard_dir=...)``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from persia.hb import metrics
from persia.hb._context import context
from persia.hb._curves import EvalCurves
from persia.hb._ps import connection
from pyrsia.shared.errors import InvalidInputError

__all__ = ["EvaluationHook", "export", "flush", "train_and_evaluate"]

log = logging.getLogger(__name__)

EvalFn = Callable[[], dict[str, Any]]


def _positive(value: Any, field: str, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(
            field, "a positive integer" + (" or None" if allow_none else ""), value
        )
    return value


class EvaluationHook:
    """Call ``eval_fn`` every ``every_n_iter`` steps (and at the end); keep the results.

    ``steps``: ``None``, one call of ``eval_fn`` evaluates the whole set; ``k``, one
    batch per call, ``k`` calls per evaluation (``hb.metrics.evaluate``).
    """

    def __init__(self, eval_fn: EvalFn, every_n_iter: int | None = None, steps: int | None = None):
        if not callable(eval_fn):
            raise InvalidInputError(
                "eval_fn", "a callable returning {name: metric or number}", eval_fn
            )
        self.eval_fn = eval_fn
        self.every_n_iter = _positive(every_n_iter, "eval_every_n_iter")
        self.steps = _positive(steps, "steps")
        self.history: list[tuple[int, dict[str, float]]] = []
        self._last = -1
        self.curves = (
            EvalCurves.from_env(context.rank, context.settings) if context.is_chief else None
        )

    def after_step(self, step: int) -> None:
        if self.every_n_iter is not None and step % self.every_n_iter == 0:
            self.evaluate(step)

    def evaluate(self, step: int) -> dict[str, float]:
        if step == self._last:
            return self.history[-1][1]
        connection.flush()  # evaluate the embeddings every step so far has trained
        values = metrics.evaluate(self.eval_fn, self.steps)
        self.history.append((step, values))
        self._last = step
        if context.is_chief:
            log.info("step %d: %s", step, ", ".join(f"{k}={v:.6g}" for k, v in values.items()))
        if self.curves is not None:
            self.curves.write(step, values)
        return values

    def close(self) -> None:
        """Close the TensorBoard writer, if any (``train_and_evaluate`` does it at the end)."""
        if self.curves is not None:
            self.curves.close()


def train_and_evaluate(
    step_fn: Callable[[Any], Any],
    data: Iterable[Any],
    *,
    eval_fn: EvalFn | None = None,
    eval_every_n_iter: int | None = None,
    max_steps: int | None = None,
    eval_steps: int | None = None,
) -> list[tuple[int, dict[str, float]]]:
    """Run ``step_fn(batch)`` over ``data`` (at most ``max_steps``), evaluating as configured.

    Returns the evaluation history ``[(step, {name: value}), ...]`` (empty without
    ``eval_fn``). ``eval_steps``: see :class:`EvaluationHook`'s ``steps``. Embedding
    gradients still in flight are flushed before each evaluation and at the end.
    """
    if not callable(step_fn):
        raise InvalidInputError("step_fn", "a callable taking one batch", step_fn)
    max_steps = _positive(max_steps, "max_steps")
    hook = EvaluationHook(eval_fn, eval_every_n_iter, eval_steps) if eval_fn is not None else None
    if hook is None and (eval_every_n_iter is not None or eval_steps is not None):
        raise InvalidInputError(
            "eval_fn", "a callable when eval_every_n_iter or eval_steps is given", None
        )
    step = 0
    for batch in data:
        if max_steps is not None and step >= max_steps:
            break
        step_fn(batch)
        step += 1
        if hook is not None:
            hook.after_step(step)
    connection.flush()
    if hook is None:
        return []
    try:
        hook.evaluate(step)
    finally:
        hook.close()
    return hook.history


def flush() -> None:
    """Wait until every embedding gradient sent by sharded modules is applied on the PS."""
    connection.flush()


def export(export_dir: str, checkpoint: str | None = None, **kwargs: Any):
    """HybridBackend's ``hb.train.export``: write the serving artifact (see persia.hb._export)."""
    from persia.hb._export import export_artifact

    return export_artifact(export_dir, checkpoint, **kwargs)
