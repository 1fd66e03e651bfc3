"""``signature.json``: what an exported model takes and returns, validated on read.

The file of an artifact (see :mod:`persia.serving.artifact`)::

    {
      "format": "pyrsia-serving-artifact",
      "format_version": 1,
      "dense": {"file": "dense.pt2", "kind": "torch.export"},        # or dense.ts, "torchscript"
      "non_id_inputs": [{"name": "dense", "dtype": "float32", "shape": [null, 5]}],
      "id_slots": ["workclass", "education", ...],                   # embedding tensor order
      "embedding_inputs": [{"name": "workclass", "dtype": "float32", "shape": [null, 8]}],
      "outputs": [{"name": "output_0", "dtype": "float32", "shape": [null, 1]}],
      "embedding_schema": {... EmbeddingSchema.to_dict() ...},
      "embedding": {"dir": "embedding", "entries": 1234, "replica_count": 2},
      "created_unix_ms": 1790000000000, "torch_version": "2.13.0"
    }

``null`` in a shape is the batch dimension. A summed slot's embedding input is
``(batch, dim)``, a raw slot's ``(batch, sample_fixed_size, dim + 1)``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pyrsia.shared.config import EmbeddingSchema
from pyrsia.shared.errors import ConfigError, InvalidInputError
from pyrsia.shared.wire.serve import DenseInput, PredictInputs

__all__ = [
    "DENSE_KINDS",
    "FORMAT",
    "FORMAT_VERSION",
    "Signature",
    "TensorSpec",
    "embedding_input_shape",
]

FORMAT = "pyrsia-serving-artifact"
FORMAT_VERSION = 1
DENSE_KINDS = {"torch.export": "dense.pt2", "torchscript": "dense.ts"}
"""Kind of the dense model file -> its file name in the artifact."""
_DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
)


def _fail(field: str, expected: str, got: Any = None) -> InvalidInputError:
    return InvalidInputError(f"signature.json: {field}", expected, got)


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor: name, dtype name, shape with ``None`` for the batch dim."""

    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, data: object, field: str) -> TensorSpec:
        if not isinstance(data, dict):
            raise _fail(field, "a map with name, dtype and shape", data)
        name, dtype, shape = data.get("name"), data.get("dtype"), data.get("shape")
        if not isinstance(name, str) or not name:
            raise _fail(f"{field}.name", "a non-empty string", name)
        if dtype not in _DTYPES:
            raise _fail(f"{field}.dtype", f"one of {list(_DTYPES)}", dtype)
        if (
            not isinstance(shape, list)
            or not shape
            or shape[0] is not None
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape[1:])
        ):
            raise _fail(f"{field}.shape", "a list [null (batch), non-negative ints...]", shape)
        return cls(name, dtype, tuple(shape))

    @property
    def numpy_dtype(self) -> np.dtype:
        """The numpy dtype requests are converted to (bfloat16 travels as float32)."""
        return np.dtype("float32" if self.dtype == "bfloat16" else self.dtype)


def embedding_input_shape(schema: EmbeddingSchema, slot: str) -> tuple[int | None, ...]:
    """The shape the embedding worker answers for ``slot`` (batch dim ``None``)."""
    cfg = schema.slot(slot)
    if cfg.embedding_summation:
        return (None, cfg.dim)
    return (None, cfg.sample_fixed_size, cfg.dim + 1)


@dataclass(frozen=True)
class Signature:
    """The validated content of ``signature.json``."""

    dense_file: str
    dense_kind: str
    non_id_inputs: tuple[TensorSpec, ...]
    id_slots: tuple[str, ...]
    embedding_inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    embedding_schema: EmbeddingSchema
    embedding_dir: str = "embedding"
    embedding_entries: int = 0
    embedding_replica_count: int = 1
    created_unix_ms: int = 0
    torch_version: str = ""

    def predict_inputs(self, max_batch: int) -> PredictInputs:
        """What a ``/predict`` request must carry (``pyrsia.shared.wire.serve`` checks it against this)."""
        dense = tuple(
            DenseInput(t.name, t.numpy_dtype, tuple(int(d) for d in t.shape[1:]))
            for t in self.non_id_inputs
        )
        return PredictInputs(dense, self.id_slots, max_batch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "dense": {"file": self.dense_file, "kind": self.dense_kind},
            "non_id_inputs": [t.to_dict() for t in self.non_id_inputs],
            "id_slots": list(self.id_slots),
            "embedding_inputs": [t.to_dict() for t in self.embedding_inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "embedding_schema": self.embedding_schema.to_dict(),
            "embedding": {
                "dir": self.embedding_dir,
                "entries": self.embedding_entries,
                "replica_count": self.embedding_replica_count,
            },
            "created_unix_ms": self.created_unix_ms,
            "torch_version": self.torch_version,
        }

    def write(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> Signature:
        """Load and validate ``signature.json``; every error names the field."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InvalidInputError(
                "signature.json", f"a file at {path} (is this an exported model directory?)"
            ) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise InvalidInputError("signature.json", "readable JSON", str(exc)) from exc
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> Signature:
        """Validate a parsed ``signature.json``; every error names the field."""
        if not isinstance(data, dict):
            raise _fail("", "a JSON object", type(data).__name__)
        _check_format(data)
        dense = _dense_entry(data)
        try:
            schema = EmbeddingSchema.from_dict(
                data.get("embedding_schema"), source="signature.json: embedding_schema"
            )
        except ConfigError as exc:
            raise _fail("embedding_schema", "a valid embedding schema", str(exc)) from exc
        specs = _tensor_specs(data)
        slots = _id_slots(data, schema, specs["embedding_inputs"])
        entries, count = _embedding_counts(data)
        created = data.get("created_unix_ms", 0)
        torch_version = data.get("torch_version", "")
        return cls(
            dense_file=dense["file"],
            dense_kind=dense["kind"],
            non_id_inputs=specs["non_id_inputs"],
            id_slots=tuple(slots),
            embedding_inputs=specs["embedding_inputs"],
            outputs=specs["outputs"],
            embedding_schema=schema,
            embedding_entries=entries,
            embedding_replica_count=count,
            created_unix_ms=created if isinstance(created, int) else 0,
            torch_version=torch_version if isinstance(torch_version, str) else "",
        )

    def replace(self, **changes: Any) -> Signature:
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- reading its parts


def _check_format(data: dict) -> None:
    """The file is a Pyrsia serving artifact's, of the version this Pyrsia reads."""
    if data.get("format") != FORMAT:
        raise _fail("format", repr(FORMAT), data.get("format"))
    version = data.get("format_version")
    if version != FORMAT_VERSION:
        raise _fail(
            "format_version",
            f"{FORMAT_VERSION} (this Pyrsia reads version {FORMAT_VERSION} artifacts; "
            "export the model again with this version)",
            version,
        )


def _dense_entry(data: dict) -> dict:
    """The ``dense`` entry: a known kind, and the file name that kind is written to."""
    dense = data.get("dense")
    if not isinstance(dense, dict) or dense.get("kind") not in DENSE_KINDS:
        raise _fail("dense.kind", f"one of {sorted(DENSE_KINDS)}", dense)
    if dense.get("file") != DENSE_KINDS[dense["kind"]]:
        raise _fail("dense.file", repr(DENSE_KINDS[dense["kind"]]), dense.get("file"))
    return dense


def _tensor_specs(data: dict) -> dict[str, tuple[TensorSpec, ...]]:
    """The non-ID inputs, embedding inputs and outputs (at least one output)."""
    specs = {}
    for key in ("non_id_inputs", "embedding_inputs", "outputs"):
        raw = data.get(key)
        if not isinstance(raw, list):
            raise _fail(key, "a list of tensor specs", raw)
        specs[key] = tuple(TensorSpec.from_dict(t, f"{key}[{i}]") for i, t in enumerate(raw))
    if not specs["outputs"]:
        raise _fail("outputs", "at least one output", [])
    return specs


def _id_slots(
    data: dict, schema: EmbeddingSchema, embedding_inputs: tuple[TensorSpec, ...]
) -> list[str]:
    """The id slots: distinct slots of ``schema``, one embedding input each, in order and of
    the shape the embedding worker answers for it."""
    slots = data.get("id_slots")
    if not isinstance(slots, list) or not all(isinstance(s, str) for s in slots):
        raise _fail("id_slots", "a list of slot names", slots)
    if len(set(slots)) != len(slots):
        raise _fail("id_slots", "distinct slot names", slots)
    for i, slot in enumerate(slots):
        if slot not in schema.slot_names:
            raise _fail(
                f"id_slots[{i}]", f"a slot of embedding_schema {list(schema.slot_names)}", slot
            )
    if [t.name for t in embedding_inputs] != slots:
        raise _fail(
            "embedding_inputs",
            f"one spec per id slot, named {slots}",
            [t.name for t in embedding_inputs],
        )
    for i, spec in enumerate(embedding_inputs):
        want = embedding_input_shape(schema, spec.name)
        if spec.shape != want:
            raise _fail(f"embedding_inputs[{i}].shape", str(list(want)), list(spec.shape))
    return slots


def _embedding_counts(data: dict) -> tuple[int, int]:
    """The ``embedding`` entry's (entries, replica_count); its dir is always ``embedding``."""
    emb = data.get("embedding")
    if not isinstance(emb, dict) or emb.get("dir") != "embedding":
        raise _fail("embedding.dir", "'embedding'", emb)
    entries, count = emb.get("entries"), emb.get("replica_count")
    for field, value, low in (("entries", entries, 0), ("replica_count", count, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise _fail(f"embedding.{field}", f"an integer >= {low}", value)
    return entries, count
