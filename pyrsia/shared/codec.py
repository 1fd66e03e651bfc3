"""The wire codec: msgpack, with numpy arrays as an extension type.

An array travels as extension ``NDARRAY_EXT_CODE`` whose payload is::

    u16 little-endian header length | msgpack [dtype str, shape] | zero padding to 16 | raw bytes

Encoding walks dicts and lists itself and emits each array's extension header and raw
bytes as separate chunks joined once at the end, so an array is copied once (not three
times, as ``ExtType`` + msgpack's growing buffer + ``bytes()`` would). Decoding wraps the
raw bytes with ``np.frombuffer`` (no copy beyond msgpack's own), so decoded arrays are
read-only; copy one before writing to it. Object, structured
and other non-numeric dtypes are refused both ways, so no pickle ever crosses the wire.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np

from pyrsia.shared.constants import MAX_ARRAY_DIMS, MAX_MESSAGE_BYTES, NDARRAY_EXT_CODE
from pyrsia.shared.constants import MAX_DECODE_DEPTH as _MAX_DEPTH
from pyrsia.shared.errors import (
    InvalidInputError,
    InvalidTypeError,
    PayloadTooLargeError,
    ProtocolError,
)

_ALIGN = 16
_ALLOWED_KINDS = frozenset("biuf")  # bool, signed, unsigned, float
_HEADER_LEN = struct.Struct("<H")
_HEADER_CACHE_MAX = 4096


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in _ALLOWED_KINDS or dtype.fields is not None or dtype.hasobject:
        raise ProtocolError(
            f"numpy dtype {dtype} cannot cross the wire: expected bool, integer or float"
        )


_encoded_headers: dict[tuple[str, tuple[int, ...]], tuple[bytes, bytes]] = {}
"""(dtype str, shape) -> (msgpack ext header, payload header) of arrays encoded so far;
emptied when it reaches ``_HEADER_CACHE_MAX`` entries."""


def _array_chunks(arr: np.ndarray) -> tuple[bytes, bytes, memoryview]:
    """(ext header, payload header, raw bytes view) of an array; the view is not copied."""
    key = (arr.dtype.str, arr.shape)
    heads = _encoded_headers.get(key)
    if heads is None:
        _check_dtype(arr.dtype)
        if arr.ndim > MAX_ARRAY_DIMS:
            raise ProtocolError(
                f"array with {arr.ndim} dimensions: at most {MAX_ARRAY_DIMS} allowed"
            )
        header = msgpack.packb([arr.dtype.str, list(arr.shape)])
        start = _HEADER_LEN.size + len(header)
        pad = (-start) % _ALIGN
        head = b"".join((_HEADER_LEN.pack(len(header)), header, b"\0" * pad))
        heads = (_ext_header(len(head) + arr.nbytes), head)
        if len(_encoded_headers) >= _HEADER_CACHE_MAX:
            _encoded_headers.clear()
        _encoded_headers[key] = heads
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return heads[0], heads[1], arr.reshape(-1).view(np.uint8).data


def _encode_array(arr: np.ndarray) -> msgpack.ExtType:
    _, head, data = _array_chunks(arr)
    return msgpack.ExtType(NDARRAY_EXT_CODE, head + bytes(data))


_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}
_EXT_CODE_BYTE = NDARRAY_EXT_CODE.to_bytes(1, "big", signed=True)


def _ext_header(n: int) -> bytes:
    """The msgpack ext header (smallest form) for an ``n``-byte payload of our array type."""
    if n in _FIXEXT:
        return bytes((_FIXEXT[n],)) + _EXT_CODE_BYTE
    if n < 1 << 8:
        return b"\xc7" + struct.pack(">B", n) + _EXT_CODE_BYTE
    if n < 1 << 16:
        return b"\xc8" + struct.pack(">H", n) + _EXT_CODE_BYTE
    if n < 1 << 32:
        return b"\xc9" + struct.pack(">I", n) + _EXT_CODE_BYTE
    raise ProtocolError(f"array of {n} bytes is over msgpack's 4 GiB extension limit")


def _walk(obj: Any, out: list, packer: msgpack.Packer, depth: int) -> None:
    """Append the msgpack encoding of ``obj`` to ``out`` as chunks (arrays as raw views)."""
    kind = type(obj)
    if depth > _MAX_DEPTH:
        raise InvalidInputError(
            "message",
            f"at most {_MAX_DEPTH} levels of nesting",
            message=f"message nested deeper than {_MAX_DEPTH} levels",
        )
    if kind is dict:
        out.append(packer.pack_map_header(len(obj)))
        for key, value in obj.items():
            if type(key) is str:  # the usual key: no recursion
                out.append(packer.pack(key))
            else:
                _walk(key, out, packer, depth + 1)
            if type(value) in _SCALARS:
                out.append(packer.pack(value))
            else:
                _walk(value, out, packer, depth + 1)
    elif kind is list or kind is tuple:
        out.append(packer.pack_array_header(len(obj)))
        for item in obj:
            if type(item) in _SCALARS:
                out.append(packer.pack(item))
            else:
                _walk(item, out, packer, depth + 1)
    elif kind is np.ndarray:
        out.extend(_array_chunks(obj))
    else:  # scalars, str, bytes, numpy scalars, sets: msgpack (+ _default) does them
        out.append(packer.pack(obj))


_SCALARS = frozenset((str, int, float, bool, bytes, type(None)))
"""Types msgpack packs itself: encoded in place by their container, without a recursive call."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return _encode_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (tuple, set, frozenset)):
        return list(obj)
    raise InvalidTypeError(  # msgpack's default hook: a TypeError, as its contract wants
        "message", "a wire type", message=f"cannot encode {type(obj).__name__} on the wire"
    )


_decoded_headers: dict[bytes, tuple[np.dtype, tuple[int, ...], int, int]] = {}
"""Checked array headers -> (dtype, shape, data offset, data bytes). A service sees a few
shapes over and over, so each is parsed and checked once; the cache is emptied when full."""


def _parse_header(head: bytes) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, data offset, data bytes) of an array payload's header, checked."""
    try:
        (header_len,) = _HEADER_LEN.unpack_from(head, 0)
        dtype_str, shape = msgpack.unpackb(head[_HEADER_LEN.size :])
        dtype = np.dtype(dtype_str)
        shape = tuple(int(s) for s in shape)
    except Exception as exc:
        raise ProtocolError(f"malformed array header: {exc}") from exc
    _check_dtype(dtype)
    if len(shape) > MAX_ARRAY_DIMS or any(s < 0 for s in shape):
        raise ProtocolError(f"malformed array shape {shape}")
    start = _HEADER_LEN.size + header_len
    return dtype, shape, start + (-start) % _ALIGN, math.prod(shape) * dtype.itemsize


def _decode_array(payload: bytes) -> np.ndarray:
    if len(payload) < _HEADER_LEN.size:
        raise ProtocolError("malformed array header: payload shorter than its length prefix")
    head = payload[: _HEADER_LEN.size + (payload[0] | payload[1] << 8)]
    parsed = _decoded_headers.get(head)
    if parsed is None:
        parsed = _parse_header(head)
        if len(_decoded_headers) >= _HEADER_CACHE_MAX:
            _decoded_headers.clear()
        _decoded_headers[head] = parsed
    dtype, shape, offset, nbytes = parsed
    if len(payload) - offset != nbytes:
        raise ProtocolError(
            f"array payload has {len(payload) - offset} bytes, shape {shape} of {dtype} needs "
            f"{nbytes}"
        )
    arr = np.frombuffer(payload, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
    return arr if len(shape) == 1 else arr.reshape(shape)


def _ext_hook(code: int, payload: bytes) -> Any:
    if code == NDARRAY_EXT_CODE:
        return _decode_array(payload)
    raise ProtocolError(f"unknown msgpack extension type {code}")


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (dicts, lists, scalars, str, bytes, numpy arrays) as msgpack bytes."""
    chunks: list = []
    try:
        _walk(obj, chunks, msgpack.Packer(default=_default, use_bin_type=True), 0)
        return b"".join(chunks)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode message: {exc}") from exc


def unpackb(data: bytes | bytearray | memoryview, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Decode msgpack bytes; arrays come back as read-only numpy views."""
    if len(data) > max_bytes:
        raise PayloadTooLargeError(
            f"message of {len(data)} bytes is over the {max_bytes}-byte cap", limit=max_bytes
        )
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"body is not valid msgpack: {exc}") from exc
