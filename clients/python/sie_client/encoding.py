"""Reading an encode result as plain Python values, under the reference SDK's names, and as float32 numpy.

The reference's helpers (`dense_embedding`, `sparse_embedding`, `sparse_embedding_dict`, `normalize_sparse_vector`,
`multivector_embedding`) turn a result into the lists and dicts that framework integrations and vector stores take,
with the reference's behaviour (absent outputs give empty values, `dense_embedding` raises ValueError unless
`strict=False`). Ours read a result as float32 numpy, int8 / uint8 outputs decoded with their scales (`dense`,
`multivector`), as {token_id: weight} (`sparse`), and do sparse arithmetic (`normalize_sparse`: unit L2 norm, which
is not what the reference's `normalize_sparse_vector` does; `sparse_dot`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from sie_client.types import EncodeResult, SparseResult, dequantize

SparseVector = dict[str, list]
"""`{"indices": list[int], "values": list[float]}`"""


def _field(holder: Any, name: str) -> Any:
    """`holder[name]` of a dict, `holder.name` of an object; None when absent."""
    return holder.get(name) if isinstance(holder, Mapping) else getattr(holder, name, None)


def _as_list(values: Any) -> list:
    return values.tolist() if hasattr(values, "tolist") else list(values)


def dense_embedding(result: Any, *, strict: bool = True) -> list[float]:
    """The dense vector as a list of floats (the values as sent: int8 outputs stay ints; `dense` decodes them).
    Without one: ValueError, or [] with `strict=False`."""
    values = _field(result, "dense")
    if values is None:
        if strict:
            raise ValueError("the encode result has no dense embedding (ask for output_types=['dense'])")
        return []
    return _as_list(values)


def normalize_sparse_vector(sparse: Any) -> SparseVector:
    """A sparse vector ({indices, values} of arrays or lists) as {"indices": list[int], "values": list[float]};
    empty lists when either is missing."""
    indices, values = _field(sparse, "indices"), _field(sparse, "values")
    if indices is None or values is None:
        return {"indices": [], "values": []}
    return {"indices": _as_list(indices), "values": _as_list(values)}


def sparse_embedding(result: Any) -> SparseVector:
    """A result's sparse vector as {"indices": list[int], "values": list[float]}; empty lists without one."""
    sparse = _field(result, "sparse")
    return normalize_sparse_vector(sparse) if sparse is not None else {"indices": [], "values": []}


def sparse_embedding_dict(result: Any) -> dict[int, float]:
    """A result's sparse vector as {token_id: weight}; {} without one."""
    vector = sparse_embedding(result)
    return dict(zip(vector["indices"], vector["values"], strict=True))


def multivector_embedding(raw: Any) -> list[list[float]]:
    """A multivector (a 2-D array, or a list of vectors) as a list of lists of floats."""
    if hasattr(raw, "tolist"):
        return raw.tolist()
    return [_as_list(vector) for vector in raw]


def dense(result: EncodeResult) -> np.ndarray:
    """The dense vector as float32, shape (dims,); KeyError if the result has none."""
    if "dense" not in result:
        raise KeyError("the result has no dense output (ask for output_types=['dense'])")
    return dequantize(result, "dense")


def multivector(result: EncodeResult) -> np.ndarray:
    """The per-token vectors as float32, shape (tokens, dims); KeyError if the result has none."""
    if "multivector" not in result:
        raise KeyError("the result has no multivector output (ask for output_types=['multivector'])")
    return dequantize(result, "multivector")


def sparse(result: EncodeResult | SparseResult) -> dict[int, float]:
    """The sparse vector as {token_id: weight}, from a result or its `sparse` entry; KeyError if it has none."""
    vector = result if "indices" in result else result.get("sparse")
    if vector is None or "indices" not in vector:
        raise KeyError("the result has no sparse output (ask for output_types=['sparse'])")
    return sparse_embedding_dict({"sparse": vector})


def normalize_sparse(vector: Mapping[int, float]) -> dict[int, float]:
    """The sparse vector scaled to unit L2 norm (an all-zero vector is returned as it is)."""
    norm = math.hypot(*vector.values())  # no overflow of the squares: weights of 1e200 keep their direction
    if norm == 0.0:
        return dict(vector)
    return {index: weight / norm for index, weight in vector.items()}


def sparse_dot(a: Mapping[int, float], b: Mapping[int, float]) -> float:
    """The dot product of two sparse vectors (on their shared token ids)."""
    small, large = (a, b) if len(a) <= len(b) else (b, a)
    return float(sum(weight * large[index] for index, weight in small.items() if index in large))
