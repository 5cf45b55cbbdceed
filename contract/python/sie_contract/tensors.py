"""numpy arrays <-> sie.v1.Tensor: little-endian packed bytes plus dtype and shape."""

from __future__ import annotations

import numpy as np
from google.protobuf.message import Message

from sie.v1 import types_pb2

# Wire dtype name -> numpy dtype of the packed elements. The packed-bit dtypes
# travel as bytes: "binary" as int8, "ubinary" as uint8.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "binary": np.dtype("i1"),
    "ubinary": np.dtype("u1"),
}
# Dtypes whose rows carry scale (and offset) to decode them.
QUANTIZED_DTYPES = ("int8", "uint8")


def to_tensor(
    array: np.ndarray,
    dtype: str,
    *,
    scale: np.ndarray | None = None,
    offset: np.ndarray | None = None,
) -> types_pb2.Tensor:
    """Pack `array` (already of the wire dtype's element type) as a Tensor, with per-row decode parameters."""
    packed = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])
    return types_pb2.Tensor(
        dtype=dtype,
        shape=packed.shape,
        data=packed.tobytes(),
        scale=[] if scale is None else np.ravel(scale).tolist(),
        offset=[] if offset is None else np.ravel(offset).tolist(),
    )


def from_tensor(tensor: types_pb2.Tensor) -> np.ndarray:
    """A read-only numpy view over the tensor's bytes (or its plain `values`)."""
    numpy_dtype = NUMPY_DTYPES.get(tensor.dtype)
    if numpy_dtype is None:
        raise ValueError(f"unknown tensor dtype {tensor.dtype!r}; known: {', '.join(NUMPY_DTYPES)}")
    shape = tuple(tensor.shape)
    if tensor.data or not tensor.values:
        return np.frombuffer(tensor.data, dtype=numpy_dtype).reshape(shape)
    return np.asarray(tensor.values, dtype=numpy_dtype).reshape(shape)


def decode_tensor(tensor: types_pb2.Tensor) -> np.ndarray:
    """The tensor as float32: int8/uint8 rows decoded as q * scale + offset; bit-packed dtypes stay packed."""
    array = from_tensor(tensor)
    if tensor.dtype not in QUANTIZED_DTYPES:
        return array.astype(np.float32) if tensor.dtype.startswith("float") else array
    return dequantize_rows(array, np.asarray(tensor.scale), np.asarray(tensor.offset) if tensor.offset else None)


def dequantize_rows(values: np.ndarray, scale: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
    """Quantized rows back to float32: q * scale + offset, one scale (and offset) per row."""
    rows = (*values.shape[:-1], 1)
    decoded = values.astype(np.float32) * np.asarray(scale, dtype=np.float32).reshape(rows)
    return decoded if offset is None else decoded + np.asarray(offset, dtype=np.float32).reshape(rows)


# Bytes one number of a spelled-out Tensor takes in the message (a packed float in `values`).
SPELLED_OUT_VALUE_BYTES = 4


def spell_out_tensors(message: Message) -> None:
    """Give every Tensor inside `message` plain `values` instead of packed `data` (for JSON callers)."""
    for field, value in message.ListFields():
        if field.message_type is None or (field.message_type.GetOptions().map_entry):
            continue
        for item in value if field.is_repeated else (value,):
            if isinstance(item, types_pb2.Tensor):
                if item.data:
                    item.values[:] = from_tensor(item).ravel().tolist()
                    item.data = b""
            else:
                spell_out_tensors(item)
