"""Hypothesis strategies for hostile request bodies.

Four families, mixed by :func:`hostile_body`:

* random bytes (mostly not msgpack at all);
* random msgpack values: nested maps/lists of scalars, strings, bytes and numpy arrays of
  every dtype the codec carries, in random shapes;
* mutations of a valid body of the route: a value replaced by a random one or an
  extreme integer, a key dropped or added, an array's dtype, shape or size changed
  (up to "huge": arrays declaring 2**40 elements), array headers forged (object and
  string dtypes, negative or overflowing shapes, lying lengths);
* byte-level damage of an encoded valid body: truncated, a byte flipped, junk appended.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
from hypothesis import strategies as st

from pyrsia.shared.codec import packb
from pyrsia.shared.constants import NDARRAY_EXT_CODE
from pyrsia.shared.errors import ProtocolError

DTYPES = [
    "uint64",
    "int64",
    "int32",
    "uint32",
    "int16",
    "int8",
    "uint8",
    "float64",
    "float32",
    "float16",
    "bool",
]
EXTREME_INTS = [
    -1,
    0,
    1,
    2,
    127,
    128,
    4096,
    2**16,
    2**16 + 1,
    2**20,
    2**31 - 1,
    2**31,
    2**32,
    2**53 + 1,
    2**62,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    -(2**31),
]


@st.composite
def arrays(draw, max_side: int = 6) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, max_side), max_size=3)))
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = draw(st.binary(min_size=n, max_size=n))
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return arr.astype(bool) if dtype == np.bool_ else arr


def _forged_ext(dtype_str: Any, shape: Any, data_len: int, header_len: int | None = None):
    header = msgpack.packb([dtype_str, shape])
    hl = len(header) if header_len is None else header_len
    start = 2 + len(header)
    pad = (-start) % 16
    payload = struct.pack("<H", hl) + header + b"\0" * pad + b"\x01" * data_len
    return msgpack.ExtType(NDARRAY_EXT_CODE, payload)


forged_arrays = st.builds(
    _forged_ext,
    st.sampled_from(
        [
            "O",
            "|O",
            "<U4",
            "|S3",
            "V8",
            "M8[ns]",
            "m8",
            "c16",
            "(2,)f4",
            "f4,i4",
            "zz",
            "",
            "<f4",
            "<u8",
            "<i8",
            "|b1",
            7,
            None,
        ]
    ),
    st.one_of(
        st.lists(st.sampled_from([0, 1, 3, 8, -1, 2**31, 2**40, 2**62, 2**63 - 1]), max_size=9),
        st.sampled_from([None, "3", [1.5], [[2]], {"a": 1}, [True]]),
    ),
    st.sampled_from([0, 1, 8, 24, 64]),
    st.one_of(st.none(), st.sampled_from([0, 1, 65535, 3])),
)

UNUSABLE_DIRS = [
    "/etc/hostname",
    "/etc/hostname/sub",
    "/proc/1/pyrsia",
    "bad\x00dir",
    "/" + "x" * 5000,
]
"""Checkpoint directories no server can use, and writing to none of them can do harm."""

scalars = st.one_of(
    st.sampled_from(UNUSABLE_DIRS),
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from(EXTREME_INTS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=12),
)

leaves = st.one_of(scalars, arrays(), forged_arrays)


def _containers(children: st.SearchStrategy) -> st.SearchStrategy:
    keys = st.one_of(st.text(max_size=10), st.integers(-5, 5))
    return st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)


values = st.recursive(leaves, _containers, max_leaves=10)


def encode(value: Any) -> bytes | None:
    """msgpack bytes of ``value`` (forged extensions kept as they are), or None if unencodable."""
    try:
        return packb(value)
    except ProtocolError:
        pass
    try:
        return msgpack.packb(value, use_bin_type=True, default=_fallback)
    except (TypeError, ValueError, OverflowError):
        return None


def _fallback(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        head = msgpack.packb([obj.dtype.str, list(obj.shape)])
        pad = (-(2 + len(head))) % 16
        raw = struct.pack("<H", len(head)) + head + b"\0" * pad + obj.tobytes()
        return msgpack.ExtType(NDARRAY_EXT_CODE, raw)
    raise TypeError(type(obj).__name__)


# --- mutations of a valid body ---------------------------------------------------------------
def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _get(value: Any, path: tuple) -> Any:
    for key in path:
        value = value[key]
    return value


def _set(root: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    _get(root, path[:-1])[path[-1]] = new
    return root


@st.composite
def array_mutation(draw, arr: np.ndarray) -> Any:
    kind = draw(st.sampled_from(["dtype", "shape", "grow", "empty", "huge", "values", "forged"]))
    if kind == "dtype":
        dtype = draw(st.sampled_from(DTYPES))
        with np.errstate(all="ignore"):  # e.g. 3.7e19 -> int8: garbage is the point here
            return arr.astype(dtype) if arr.size else np.zeros(arr.shape, dtype)
    if kind == "shape":
        flat = arr.reshape(-1)
        return flat.reshape(1, -1) if draw(st.booleans()) else flat[: max(0, flat.size - 1)]
    if kind == "grow":
        reps = draw(st.integers(2, 3000))
        return np.concatenate([arr.reshape(-1)] * reps) if arr.size else arr
    if kind == "empty":
        return arr.reshape(-1)[:0]
    if kind == "huge":
        return _forged_ext(arr.dtype.str, [draw(st.sampled_from([2**31, 2**40, 2**62]))], 0)
    if kind == "values":
        out = arr.copy().reshape(-1)
        if out.size:
            if out.dtype.kind == "f":
                out[draw(st.integers(0, out.size - 1))] = draw(
                    st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -0.0])
                )
            elif out.dtype.kind in "iu":
                out[draw(st.integers(0, out.size - 1))] = np.iinfo(out.dtype).max
        return out.reshape(arr.shape)
    return draw(forged_arrays)


@st.composite
def mutated(draw, template: Any) -> Any:
    """``template`` with one to three structural mutations."""
    body = _copy(template)
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        target = _get(body, path)
        action = draw(st.sampled_from(["replace", "extreme", "drop", "add", "array"]))
        if action == "array" and isinstance(target, np.ndarray):
            body = _set(body, path, draw(array_mutation(target)))
        elif action == "drop" and path:
            parent = _get(body, path[:-1])
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent.pop(path[-1])
        elif action == "add" and isinstance(target, (dict, list)):
            if isinstance(target, dict):
                target[draw(st.text(max_size=8))] = draw(values)
            else:
                target.append(draw(values))
        elif action == "extreme":
            body = _set(body, path, draw(st.sampled_from(EXTREME_INTS)))
        else:
            body = _set(body, path, draw(values))
    return body


@st.composite
def damaged_bytes(draw, raw: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "append"]))
    if kind == "truncate" and raw:
        return raw[: draw(st.integers(0, len(raw) - 1))]
    if kind == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1 :]
    return raw + draw(st.binary(min_size=1, max_size=16))


@st.composite
def hostile_body(draw, template: Any) -> tuple[str, bytes]:
    """``(family, bytes)`` of one hostile body for a route whose valid body is ``template``."""
    family = draw(st.sampled_from(["bytes", "random", "mutated", "mutated", "mutated", "damaged"]))
    if family == "bytes":
        return family, draw(st.binary(max_size=64))
    if family == "random":
        raw = encode(draw(values))
    elif family == "mutated":
        raw = encode(draw(mutated(template)))
    else:
        valid = encode(template)
        raw = draw(damaged_bytes(valid)) if valid is not None else None
    return family, raw if raw is not None else b"\xc1"
