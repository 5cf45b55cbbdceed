"""Reading an encode result: its dense, sparse and multivector outputs as plain numpy / dict values.

A result (a dict from `encode`) holds each output under its name; int8 / uint8 outputs are decoded
to float32 with their scales (see `dequantize`). Sparse vectors become {token_id: weight} dicts, the
shape vector stores such as Qdrant and the reference SDK's helpers take.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np

from sie_client.types import EncodeResult, SparseVector, dequantize


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


def sparse(result: EncodeResult | SparseVector) -> dict[int, float]:
    """The sparse vector as {token_id: weight}, from a result or its `sparse` entry."""
    fields = cast(Mapping[str, Any], result)  # a result or a SparseVector, told apart at run time
    vector = fields if "indices" in fields else fields.get("sparse", fields)
    if "indices" not in vector:
        raise KeyError("the result has no sparse output (ask for output_types=['sparse'])")
    return {int(index): float(value) for index, value in zip(vector["indices"], vector["values"], strict=True)}


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
