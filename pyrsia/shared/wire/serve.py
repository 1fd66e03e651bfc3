"""Bodies of the serving endpoint ``POST /predict`` (``persia-launcher serve``).

Request (msgpack or JSON; arrays are numpy arrays in msgpack, nested lists in JSON)::

    {"non_id": {"<input name>": array (batch, ...)},       one per PredictInputs.non_id
     "ids":    {"<slot>": ids},                           one per PredictInputs.id_slots, where ids is
                  [id, id, ...]                             one id per sample (length batch), or
                  {"ids": [...], "offsets": [...]}          CSR: sample i owns ids[offsets[i]:offsets[i+1]]
                  [[id, ...], [], ...]                      (JSON) the ids of each sample
    }

or, in msgpack, ``{"batch": <PersiaBatch.to_bytes()>}`` as PERSIA's TorchServe client sends it
(non-ID features in signature order). Answer::

    {"batch_size": int, "outputs": {"<output name>": array (batch, ...)}}

A request is checked once against the model's :class:`PredictInputs` (built from its
``signature.json``); every problem is an ``InvalidInputError`` naming the field
(``ids.workclass.offsets``) and what was expected, so the route answers 400. Checks are
vectorized: no Python loop per id.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from pyrsia.shared import codec
from pyrsia.shared.errors import InvalidInputError
from pyrsia.shared.validate import as_dict, as_int, get
from pyrsia.shared.wire.batch import MAX_BATCH_SIZE, DensePart, IDFeature, IDPart
from pyrsia.shared.wire.ps import peer_answer

_TOP_KEYS = ("non_id", "ids", "batch")


@dataclass(frozen=True)
class DenseInput:
    """One non-ID input of the model: its name, numpy dtype and shape after the batch dim."""

    name: str
    dtype: np.dtype
    row_shape: tuple[int, ...]

    @property
    def shape_text(self) -> str:
        return "(batch" + "".join(f", {d}" for d in self.row_shape) + ")"


@dataclass(frozen=True)
class PredictInputs:
    """What a served model takes (from its signature): requests are checked against it."""

    non_id: tuple[DenseInput, ...]
    id_slots: tuple[str, ...]
    max_batch: int = MAX_BATCH_SIZE


def _dense(value: Any, spec: DenseInput, field: str) -> np.ndarray:
    want = spec.dtype
    if isinstance(value, np.ndarray):
        if not (value.dtype == want or np.can_cast(value.dtype, want, "same_kind")):
            raise InvalidInputError(
                field, f"dtype {want} (or one that casts to it)", str(value.dtype)
            )
        arr = value.astype(want, copy=False)
    elif isinstance(value, list):
        try:
            arr = np.asarray(value, dtype=want)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(
                field, f"{want} values of shape {spec.shape_text}", "a list that is not"
            ) from None
    else:
        raise InvalidInputError(
            field, f"an array or nested list of shape {spec.shape_text}", type(value).__name__
        )
    if arr.ndim != 1 + len(spec.row_shape) or arr.shape[1:] != spec.row_shape:
        raise InvalidInputError(field, f"shape {spec.shape_text}", f"shape {arr.shape}")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():
        raise InvalidInputError(field, "finite numbers", "NaN or infinity")
    return arr


def _uint64(value: Any, field: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or value.ndim != 1:
            raise InvalidInputError(field, "a 1-D integer array", f"{value.dtype} {value.shape}")
        if value.dtype.kind == "i" and value.size and value.min() < 0:
            raise InvalidInputError(field, "ids >= 0", int(value.min()))
        return value.astype(np.uint64, copy=False)
    if not isinstance(value, list):
        raise InvalidInputError(field, "a list of ids", type(value).__name__)
    try:
        arr = np.asarray(value, dtype=np.uint64) if value else np.empty(0, np.uint64)
    except (TypeError, ValueError, OverflowError):
        raise InvalidInputError(field, "integer ids in [0, 2^64)", "other values") from None
    if arr.ndim != 1:
        raise InvalidInputError(field, "a flat list of ids", f"shape {arr.shape}")
    return arr


def _slot_ids(value: Any, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(uint64 ids, int64 offsets) of one slot, whatever form it came in."""
    if isinstance(value, dict):
        unknown = set(value) - {"ids", "offsets"}
        if unknown:
            raise InvalidInputError(
                field, "a map with keys ids and offsets", sorted(map(str, unknown))
            )
        ids = _uint64(get(value, "ids", f"{field}.ids"), f"{field}.ids")
        try:
            offsets = np.asarray(get(value, "offsets", f"{field}.offsets"), dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInputError(f"{field}.offsets", "integer offsets", "other values") from None
        if offsets.ndim != 1 or offsets.shape[0] < 2:
            raise InvalidInputError(
                f"{field}.offsets", "batch + 1 integers", f"shape {offsets.shape}"
            )
        if offsets[0] != 0 or offsets[-1] != ids.shape[0] or (np.diff(offsets) < 0).any():
            raise InvalidInputError(
                f"{field}.offsets",
                f"non-decreasing integers from 0 to len(ids) = {ids.shape[0]}",
                f"[{offsets[0]} .. {offsets[-1]}]",
            )
        return ids, offsets
    if isinstance(value, list) and value and isinstance(value[0], list):  # JSON: ids per sample
        if not all(isinstance(v, list) for v in value):
            raise InvalidInputError(field, "a list of id lists (one per sample)", "a mixed list")
        lengths = np.fromiter(map(len, value), dtype=np.int64, count=len(value))
        ids = _uint64(list(itertools.chain.from_iterable(value)), field)
        return ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = _uint64(value, field)  # one id per sample
    return ids, np.arange(ids.shape[0] + 1, dtype=np.int64)


def _batch(size: int, batch: int | None, field: str, max_batch: int) -> int:
    if batch is not None and size != batch:
        raise InvalidInputError(field, f"batch size {batch} (as the other inputs)", size)
    if not 1 <= size <= max_batch:
        raise InvalidInputError(field, f"a batch of 1 to {max_batch} samples", size)
    return size


def _names(given: dict, known: list[str], field: str, what: str) -> None:
    extra = sorted(str(k) for k in given if k not in known)
    if extra:
        raise InvalidInputError(field, f"only the model's {what} {known}", extra)


@dataclass(frozen=True, eq=False)
class PredictRequest:
    """A checked ``/predict`` request: dense inputs in the model's order and the id part the
    embedding workers look up (one CSR feature per slot, in the model's slot order)."""

    batch_size: int
    non_id: tuple[tuple[str, np.ndarray], ...]
    id_part: IDPart

    @property
    def non_id_arrays(self) -> list[np.ndarray]:
        return [a for _, a in self.non_id]

    @classmethod
    def from_wire(cls, body: Any, inputs: PredictInputs) -> PredictRequest:
        """Check a decoded body against ``inputs``; see the module docstring for its shape."""
        if not isinstance(body, dict):
            raise InvalidInputError(
                "body", "a map with non_id and ids (or batch)", type(body).__name__
            )
        unknown = sorted(str(k) for k in body if k not in _TOP_KEYS)
        if unknown:
            raise InvalidInputError("body", f"only the keys {list(_TOP_KEYS)}", unknown)
        if "batch" in body:
            return cls._from_persia_batch(body["batch"], inputs)
        non_id_raw = as_dict(body.get("non_id", {}), "non_id")
        ids_raw = as_dict(get(body, "ids"), "ids")
        names = [t.name for t in inputs.non_id]
        _names(non_id_raw, names, "non_id", "names")
        _names(ids_raw, list(inputs.id_slots), "ids", "names")
        batch: int | None = None
        non_id = []
        for spec in inputs.non_id:
            field = f"non_id.{spec.name}"
            if spec.name not in non_id_raw:
                raise InvalidInputError(
                    field, f"an array of shape (batch, ...) (missing; the model takes {names})"
                )
            arr = _dense(non_id_raw[spec.name], spec, field)
            batch = _batch(arr.shape[0], batch, field, inputs.max_batch)
            non_id.append((spec.name, arr))
        features = []
        for slot in inputs.id_slots:
            field = f"ids.{slot}"
            if slot not in ids_raw:
                raise InvalidInputError(
                    field, f"the slot's ids (missing; the model takes {list(inputs.id_slots)})"
                )
            ids, offsets = _slot_ids(ids_raw[slot], field)
            batch = _batch(offsets.shape[0] - 1, batch, field, inputs.max_batch)
            features.append(IDFeature(slot, ids, offsets))
        if batch is None:
            raise InvalidInputError("ids", "at least one input (the model takes none?)")
        return cls(batch, tuple(non_id), IDPart(batch, False, tuple(features)))

    @classmethod
    def _from_persia_batch(cls, raw: Any, inputs: PredictInputs) -> PredictRequest:
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raise InvalidInputError(
                "batch", "bytes from PersiaBatch.to_bytes()", type(raw).__name__
            )
        data = codec.unpackb(bytes(raw))
        ids, dense = IDPart.from_wire(data, "batch"), DensePart.from_wire(data, "batch")
        size = _batch(ids.batch_size, None, "batch.batch_size", inputs.max_batch)
        features = dense.non_id_type_features
        if len(features) != len(inputs.non_id):
            raise InvalidInputError(
                "batch.non_id_type_features", f"{len(inputs.non_id)} features", len(features)
            )
        non_id = tuple(
            (spec.name, _dense(f.data, spec, f"batch.non_id_type_features[{i}]"))
            for i, (f, spec) in enumerate(zip(features, inputs.non_id, strict=True))
        )
        by_name = {f.name: f for f in ids.id_type_features}
        missing = [s for s in inputs.id_slots if s not in by_name]
        if missing:
            raise InvalidInputError(
                "batch.id_type_features",
                f"the model's slots {list(inputs.id_slots)}",
                f"missing {missing}",
            )
        return cls(size, non_id, IDPart(size, False, tuple(by_name[s] for s in inputs.id_slots)))

    def to_wire(self, *, as_json: bool = False) -> dict[str, Any]:
        """The body a client sends (ids in CSR form; nested lists when ``as_json``)."""
        conv = (lambda a: a.tolist()) if as_json else (lambda a: a)
        return {
            "non_id": {n: conv(a) for n, a in self.non_id},
            "ids": {
                f.name: {"ids": conv(f.ids), "offsets": conv(f.offsets)}
                for f in self.id_part.id_type_features
            },
        }


@dataclass(frozen=True, eq=False)
class PredictAnswer:
    """The answer of ``/predict``: one array ``(batch, ...)`` per model output, in order."""

    batch_size: int
    outputs: tuple[tuple[str, np.ndarray], ...]

    @classmethod
    def from_wire(cls, answer: Any) -> PredictAnswer:
        """Check a decoded answer (msgpack arrays or JSON lists; a bad one is a ProtocolError)."""
        with peer_answer("serve /predict"):
            body = as_dict(answer, "answer")
            size = as_int(get(body, "batch_size"), "batch_size", min_value=1)
            outputs = []
            for name, value in as_dict(get(body, "outputs"), "outputs").items():
                field = f"outputs.{name}"
                try:
                    arr = value if isinstance(value, np.ndarray) else np.asarray(value, np.float64)
                except (TypeError, ValueError, OverflowError):
                    raise InvalidInputError(
                        field, "a numeric array", type(value).__name__
                    ) from None
                if arr.ndim < 1 or arr.shape[0] != size:
                    raise InvalidInputError(
                        field, f"an array of {size} rows (the batch size)", f"shape {arr.shape}"
                    )
                outputs.append((str(name), arr))
            return cls(size, tuple(outputs))

    def to_wire(self, *, as_json: bool = False) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "outputs": {n: (a.tolist() if as_json else a) for n, a in self.outputs},
        }
