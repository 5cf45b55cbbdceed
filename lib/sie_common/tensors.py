"""numpy arrays <-> sie.v1.Tensor: little-endian packed bytes plus dtype and shape."""

from __future__ import annotations

import numpy as np

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


def to_tensor(array: np.ndarray, dtype: str) -> types_pb2.Tensor:
    """Pack `array` (already of the wire dtype's element type) as a Tensor."""
    packed = np.ascontiguousarray(array, dtype=NUMPY_DTYPES[dtype])
    return types_pb2.Tensor(dtype=dtype, shape=packed.shape, data=packed.tobytes())


def from_tensor(tensor: types_pb2.Tensor) -> np.ndarray:
    """A read-only numpy view over the tensor's bytes (or its plain `values`)."""
    numpy_dtype = NUMPY_DTYPES.get(tensor.dtype)
    if numpy_dtype is None:
        raise ValueError(f"unknown tensor dtype {tensor.dtype!r}; known: {', '.join(NUMPY_DTYPES)}")
    shape = tuple(tensor.shape)
    if tensor.data or not tensor.values:
        return np.frombuffer(tensor.data, dtype=numpy_dtype).reshape(shape)
    return np.asarray(tensor.values, dtype=numpy_dtype).reshape(shape)
