import msgpack
import numpy as np
import pytest

from pyrsia.shared.codec import packb, unpackb
from pyrsia.shared.errors import PayloadTooLargeError, ProtocolError


@pytest.mark.parametrize(
    "dtype",
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint64", "float16", "float32", "float64"],
)
def test_arrays_round_trip_every_dtype(dtype):
    arr = (np.arange(24) % 7).astype(dtype).reshape(2, 3, 4)
    out = unpackb(packb({"a": arr}))["a"]
    assert out.dtype == arr.dtype and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_decoded_arrays_are_aligned_read_only_views():
    out = unpackb(packb([np.ones(1000, np.float64)]))[0]
    assert out.ctypes.data % 16 == 0
    assert not out.flags.writeable
    assert not out.flags.owndata


def test_empty_and_non_contiguous_arrays():
    empty = unpackb(packb(np.zeros((0, 5), np.float32)))
    assert empty.shape == (0, 5)
    strided = np.arange(20, dtype=np.int64)[::3]
    np.testing.assert_array_equal(unpackb(packb(strided)), strided)


def test_scalars_and_containers():
    msg = {
        "s": "x",
        "b": b"\x00\x01",
        "n": None,
        "l": [1, 2.5, True],
        "t": (1, 2),
        "np": np.float32(2),
    }
    assert unpackb(packb(msg)) == {
        "s": "x",
        "b": b"\x00\x01",
        "n": None,
        "l": [1, 2.5, True],
        "t": [1, 2],
        "np": 2.0,
    }


def test_object_dtype_refused_both_ways():
    with pytest.raises(ProtocolError, match="object"):
        packb(np.array(["a", None], dtype=object))
    header = msgpack.packb(["|O", [1]])
    payload = len(header).to_bytes(2, "little") + header
    forged = msgpack.packb(msgpack.ExtType(42, payload + b"\0" * 64))
    with pytest.raises(ProtocolError, match="cannot cross the wire"):
        unpackb(forged)


def test_garbage_and_truncated_payloads_are_protocol_errors():
    with pytest.raises(ProtocolError):
        unpackb(b"\xc1\xff\x00garbage")
    good = packb(np.arange(100, dtype=np.int64))
    with pytest.raises(ProtocolError):
        unpackb(good[:-8])
    header = msgpack.packb(["<f4", [1000]])
    short = msgpack.packb(
        msgpack.ExtType(42, len(header).to_bytes(2, "little") + header + b"\0" * 8)
    )
    with pytest.raises(ProtocolError, match="needs"):
        unpackb(short)


def test_size_cap_is_a_413_naming_the_limit():
    with pytest.raises(PayloadTooLargeError, match="100-byte cap") as err:
        unpackb(packb(np.zeros(1000, np.uint8)), max_bytes=100)
    assert err.value.limit == 100 and err.value.status == 413
    assert isinstance(err.value, ProtocolError)


def test_unknown_python_type_refused():
    with pytest.raises(ProtocolError):
        packb({"x": object()})
