"""The HTTP adapter's body bounds, in process: msgpack and JSON read within their nesting, lengths, value counts and
array rules, hostile bodies refused with a reason before anything large is built, and in time linear in the body."""

from __future__ import annotations

import json
import pickle
import struct
import time
import tracemalloc

import msgpack
import numpy as np
import pytest

from sie_gateway.http_adapter.bodies import BodyLimits, json_body, msgpack_body
from sie_gateway.http_adapter.errors import AdapterError

LIMITS = BodyLimits(max_bytes=16 * 2**20, max_depth=32, max_container_len=16384, max_values=262144, read_timeout_s=30)


def refused(decode, data: bytes) -> AdapterError:
    with pytest.raises(AdapterError) as raised:
        decode(data, LIMITS)
    assert raised.value.status == 400
    return raised.value


def array_map(array: np.ndarray, **override: object) -> dict:
    fields = {
        b"nd": True,
        b"type": array.dtype.str,
        b"kind": b"",
        b"shape": list(array.shape),
        b"data": array.tobytes(),
    }
    fields.update({key.encode(): value for key, value in override.items()})
    return fields


def test_a_reference_body_decodes_with_its_numpy_arrays() -> None:
    vector = np.arange(6, dtype=np.float32).reshape(2, 3)
    body = msgpack_body(msgpack.packb({"items": [{"text": "x"}], "v": array_map(vector)}, use_bin_type=True), LIMITS)
    assert body["items"] == [{"text": "x"}]
    np.testing.assert_array_equal(body["v"], vector)
    scalar = np.float16(1.5)
    decoded = msgpack_body(msgpack.packb({"s": {b"nd": False, b"type": "<f2", b"data": scalar.tobytes()}}), LIMITS)
    assert decoded["s"] == scalar


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1", "INVALID_MSGPACK"),  # a byte msgpack never uses
        (msgpack.packb({"items": "x"})[:-1], "INVALID_MSGPACK"),  # cut short
        (msgpack.packb({"a": 1}) + msgpack.packb({"b": 2}), "INVALID_MSGPACK"),  # two values
        (msgpack.packb([1, 2]), "INVALID_MSGPACK"),  # not a map
        (b"\xdf\xff\xff\xff\xff", "INVALID_MSGPACK"),  # a map of 4 billion entries, announced
        (b"\xdd\xff\xff\xff\xff", "INVALID_MSGPACK"),  # an array of 4 billion entries
        (b"\x81\xa1k\xdb\xff\xff\xff\xff", "INVALID_MSGPACK"),  # a 4 GB string
        (b"\x81\xa1k\xc6\xff\xff\xff\xff", "INVALID_MSGPACK"),  # 4 GB of bin
        (b"\x81\xa1k\xd6\xff" + b"\x00" * 4, "INVALID_MSGPACK"),  # an extension type (a timestamp)
        (msgpack.packb({"a": 1, 7: 2}), "INVALID_MSGPACK"),  # a key that is not a string
        (b"\x82\xa1a\x01\xa1a\x02", "DUPLICATE_FIELD"),  # {"a": 1, "a": 2}
        (msgpack.packb({"a": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}), "TOO_DEEP"),
        (b"\x81\xa1a" + b"\x91" * 100000 + b"\x01", "INVALID_MSGPACK"),  # 100,000 levels
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_malformed_msgpack_is_refused(data: bytes, reason: str) -> None:
    assert refused(msgpack_body, data).reason == reason


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"kind": b"O", "type": "|O", "data": pickle.dumps(print)}, "ARRAY_DTYPE_REFUSED"),  # would unpickle
        ({"kind": b"V", "type": "|V8"}, "ARRAY_DTYPE_REFUSED"),  # a structured dtype
        ({"type": "<U4"}, "ARRAY_DTYPE_REFUSED"),
        ({"type": "<c8"}, "ARRAY_DTYPE_REFUSED"),  # complex
        ({"type": [1, 2]}, "ARRAY_DTYPE_REFUSED"),
        ({"shape": [4, 8]}, "ARRAY_SHAPE_MISMATCH"),  # 64 bytes of data for 32 values
        ({"shape": [1] * 9 + [16]}, "INVALID_ARRAY"),  # more than 8 dimensions
        ({"shape": [-16]}, "INVALID_ARRAY"),
        ({"shape": "16"}, "INVALID_ARRAY"),
        ({"nd": 1}, "INVALID_ARRAY"),
        ({"data": "not bytes"}, "INVALID_ARRAY"),
        ({"extra": 1}, "INVALID_ARRAY"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_hostile_numpy_arrays_are_refused(fields: dict, reason: str) -> None:
    body = msgpack.packb({"v": array_map(np.zeros(16, np.float32), **fields)}, use_bin_type=True)
    assert refused(msgpack_body, body).reason == reason


def test_many_small_values_are_refused_before_they_are_all_built() -> None:
    # 8 MB of nils in arrays of 16,384: 8 million values, refused at the limit of 262,144.
    row = b"\xdc" + struct.pack(">H", 16384) + b"\xc0" * 16384
    body = b"\x81\xa1k\xdd" + struct.pack(">I", 512) + row * 512
    tracemalloc.start()
    started = time.monotonic()
    assert refused(msgpack_body, body).reason == "TOO_MANY_VALUES"
    elapsed = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert elapsed < 5, elapsed
    assert peak < 64 * 2**20, peak  # a few arrays' worth, not 8 million values


def test_json_bodies_are_strict_and_bounded() -> None:
    assert json_body(b'{"a": [1, {"b": "c"}]}', LIMITS) == {"a": [1, {"b": "c"}]}
    assert refused(json_body, b'{"a": 1, "a": 2}').reason == "DUPLICATE_FIELD"
    assert refused(json_body, b'{"a": NaN}').reason == "INVALID_JSON"
    assert refused(json_body, b'{"a": 1,}').reason == "INVALID_JSON"
    assert refused(json_body, b"\xff\xfe").reason == "INVALID_JSON"
    assert refused(json_body, b"[" * 40 + b"]" * 40).reason == "TOO_DEEP"
    assert refused(json_body, b"[" * 100000 + b"]" * 100000).reason == "TOO_DEEP"
    assert refused(json_body, json.dumps([0] * 20000).encode()).reason == "CONTAINER_TOO_LONG"
    many = json.dumps({"k": [[0] * 16000] * 20}).encode()  # 320,000 values
    assert refused(json_body, many).reason == "TOO_MANY_VALUES"
    wide = json.dumps({str(i): i for i in range(20000)}).encode()
    assert refused(json_body, wide).reason == "CONTAINER_TOO_LONG"
    assert refused(json_body, b'{"top_n": ' + b"9" * 5000 + b"}").reason == "INVALID_JSON"  # past int's digit limit
    assert refused(json_body, b'{"query": "\\ud800"}').reason == "INVALID_JSON"  # a lone surrogate
    assert refused(json_body, b'{"\\udc00": 1}').reason == "INVALID_JSON"
    assert refused(json_body, b'{"q": ["x", "\\udfff"]}').reason == "INVALID_JSON"
    assert json_body(b'{"q": "\\ud83d\\ude00 \\u00e9"}', LIMITS) == {"q": "\U0001f600 \u00e9"}  # a pair is text
