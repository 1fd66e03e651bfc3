"""What ``hb.metrics`` accepts: labels and predictions turned into flat numpy arrays, checked.

TF's shape rule (HybridBackend's metrics are TF metrics): a trailing dimension of 1 on either
side is dropped, then both must have one shape. Floats widen to float64 (no two distinct
scores become a tie), booleans become int64; NaN, infinity and non-numbers are refused, as are
binary labels other than 0/1 and class ids that are not whole numbers. Every refusal is an
:class:`~pyrsia.shared.errors.InvalidInputError` naming the argument.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pyrsia.shared.errors import InvalidInputError

__all__ = ["aligned", "binary", "check_class_ids"]

_NUMBERS = "numbers (a tensor, a numpy array or a list of numbers)"


def _array(values: Any, field: str) -> np.ndarray:
    """``values`` as a numpy array of its own shape: booleans and integers kept, floats as
    float64 (bf16/fp16/fp32 widen exactly, so no two distinct scores become a tie)."""
    if isinstance(values, torch.Tensor):
        values = values.detach()
        if values.is_floating_point():  # bf16 has no numpy dtype; float64 holds it exactly
            values = values.to(torch.float64)
        values = values.cpu().numpy()
    try:
        array = np.asarray(values)
    except (TypeError, ValueError) as exc:  # ragged nested lists
        raise InvalidInputError(field, _NUMBERS, type(values).__name__) from exc
    if array.dtype.kind == "b":
        return array.astype(np.int64)
    if array.dtype.kind in "iu":
        return array
    if array.dtype.kind != "f":
        raise InvalidInputError(field, _NUMBERS, f"dtype {array.dtype}")
    array = array.astype(np.float64, copy=False)
    if not np.all(np.isfinite(array)):
        raise InvalidInputError(field, "finite numbers", "NaN or infinity")
    return array


def aligned(labels: Any, predictions: Any) -> tuple[np.ndarray, np.ndarray]:
    """Labels and predictions flattened, after TF's ``remove_squeezable_dimensions``.

    A trailing dimension of 1 is dropped from the side with one more dimension; then
    both must have one shape (TF's ``assert_is_compatible_with``), as HybridBackend's
    metrics require (hybridbackend/tensorflow/metrics/accuracy.py, auc.py).
    """
    p, y = _array(predictions, "predictions"), _array(labels, "labels")
    if p.ndim == y.ndim + 1 and p.shape[-1] == 1:
        p = p[..., 0]
    elif y.ndim == p.ndim + 1 and y.shape[-1] == 1:
        y = y[..., 0]
    if y.shape != p.shape:
        hint = ""
        if p.ndim == y.ndim + 1:
            hint = (
                "; predictions has one dimension more than labels: pass class ids "
                "(predictions.argmax(-1)) to accuracy, or the positive class's scores to auc"
            )
        raise InvalidInputError(
            "labels",
            f"as many values as predictions, in the same shape (a trailing dimension of 1 is "
            f"dropped){hint}",
            f"labels of shape {tuple(y.shape)}, predictions of shape {tuple(p.shape)}",
        )
    return y.reshape(-1), p.reshape(-1)


def binary(labels: np.ndarray) -> np.ndarray:
    """The positives of 0/1 labels; any other label is refused (TF would call it true)."""
    positive = labels == 1
    wrong = ~(positive | (labels == 0))
    if wrong.any():
        raise InvalidInputError(
            "labels", "0 or 1 (binary labels: the positive class is 1)", labels[wrong][0].item()
        )
    return positive


def check_class_ids(values: np.ndarray, field: str) -> None:
    """Refuse values that are not whole numbers (probabilities, logits, soft labels)."""
    if values.dtype.kind != "f":
        return
    wrong = values != np.floor(values)
    if wrong.any():
        how = (
            "; for probabilities of the positive class use Accuracy(threshold=0.5), for "
            "logits pass predictions.argmax(-1)"
            if field == "predictions"
            else ""
        )
        raise InvalidInputError(
            field,
            f"class ids (whole numbers: accuracy compares predictions and labels for "
            f"equality, as HybridBackend's does){how}",
            values[wrong][0].item(),
        )
