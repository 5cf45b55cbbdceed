"""After the forward pass, on the CPU pool: MUVERA, Matryoshka truncation, then the output dtype (always last)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

OUTPUT_DTYPES = ("float32", "float16", "int8", "uint8", "binary", "ubinary")
# MUVERA partitions space into 2^k_sim parts per repetition.
MAX_K_SIM = 10


@dataclass(frozen=True)
class Quantized:
    """An array in its wire dtype, with the per-row decode parameters int8/uint8 need."""

    values: np.ndarray
    dtype: str
    scale: np.ndarray | None = None
    offset: np.ndarray | None = None


def truncate(vectors: np.ndarray, *, dims: int | None, normalized: bool) -> np.ndarray:
    """Rows of `vectors` cut to `dims`, renormalized when the model normalizes."""
    if dims is None or dims >= vectors.shape[-1]:
        return vectors
    vectors = vectors[..., :dims]
    if normalized:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return vectors


def quantize(vectors: np.ndarray, dtype: str) -> Quantized:
    """Rows (the last axis) in `dtype`.

    int8: symmetric, q = round(x / s) with s = max|x| / 127.
    uint8: min/max, q = round((x - m) / s) with m = min x, s = (max x - m) / 255.
    Both decode as q * s + m (m = 0 for int8), within s / 2 of x.
    binary / ubinary: one bit per value, set when x > 0, packed big-endian 8 to a byte (numpy.packbits).
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    if dtype in ("float32", "float16"):
        return Quantized(vectors.astype(dtype), dtype)
    if dtype == "int8":
        scale = np.abs(vectors).max(axis=-1, keepdims=True) / 127.0
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        values = np.clip(np.rint(vectors / scale), -127, 127).astype(np.int8)
        return Quantized(values, dtype, scale=scale[..., 0])
    if dtype == "uint8":
        low = vectors.min(axis=-1, keepdims=True)
        scale = (vectors.max(axis=-1, keepdims=True) - low) / 255.0
        scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
        values = np.clip(np.rint((vectors - low) / scale), 0, 255).astype(np.uint8)
        return Quantized(values, dtype, scale=scale[..., 0], offset=low[..., 0])
    if dtype in ("binary", "ubinary"):
        packed = np.packbits(vectors > 0, axis=-1)
        return Quantized(packed.view(np.int8) if dtype == "binary" else packed, dtype)
    raise ValueError(f"unknown output dtype {dtype!r}; known: {', '.join(OUTPUT_DTYPES)}")


@dataclass(frozen=True)
class MuveraParams:
    """MUVERA fixed-dimensional encoding: `repetitions` x 2^`k_sim` partitions x `d_proj` dims."""

    k_sim: int = 4
    d_proj: int = 16
    repetitions: int = 10
    seed: int = 42

    @property
    def dims(self) -> int:
        return self.repetitions * (2**self.k_sim) * self.d_proj

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> MuveraParams:
        """From a `muvera` mapping (model run_options merged with request options); unknown keys are errors."""
        allowed = set(cls.__dataclass_fields__)
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise ValueError(f"muvera.{unknown[0]}: unknown parameter; known: {', '.join(sorted(allowed))}")
        values = {}
        for key, value in options.items():
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or int(value) != value
            ):
                raise ValueError(f"muvera.{key}: must be an integer, got {value!r}")
            values[key] = int(value)
        params = cls(**values)
        if not (
            1 <= params.k_sim <= MAX_K_SIM
            and params.d_proj >= 1
            and params.repetitions >= 1
            and 0 <= params.seed < 2**63
        ):
            raise ValueError(f"muvera: need 1 <= k_sim <= {MAX_K_SIM}, d_proj >= 1, repetitions >= 1, 0 <= seed < 2^63")
        return params


def muvera(multivector: np.ndarray, params: MuveraParams, *, is_query: bool) -> np.ndarray:
    """One fixed-dimensional vector for a set of token vectors [tokens, dim], as in the MUVERA paper.

    Each repetition draws (from `seed`) k_sim Gaussian hyperplanes that split space into 2^k_sim
    partitions (SimHash) and a random ±1 projection to d_proj dims. A query sums its vectors per
    partition; a document averages them and fills an empty partition with its vector nearest to that
    partition (by Hamming distance of the SimHash codes). dot(query FDE, document FDE) then
    approximates the MaxSim (Chamfer) similarity.
    """
    vectors = np.asarray(multivector, dtype=np.float32)
    dim = vectors.shape[1]
    rng = np.random.default_rng(params.seed)
    partitions = 2**params.k_sim
    parts = []
    for _ in range(params.repetitions):
        planes = rng.standard_normal((dim, params.k_sim)).astype(np.float32)
        projection = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=(dim, params.d_proj)) / np.sqrt(
            params.d_proj
        )
        bits = (vectors @ planes > 0).astype(np.int64)
        codes = bits @ (1 << np.arange(params.k_sim))
        sums = np.zeros((partitions, dim), dtype=np.float32)
        np.add.at(sums, codes, vectors)
        if not is_query:
            counts = np.bincount(codes, minlength=partitions).astype(np.float32)
            sums = sums / np.maximum(counts, 1)[:, None]
            empty = np.flatnonzero(counts == 0)
            if empty.size and vectors.shape[0]:
                empty_bits = (empty[:, None] >> np.arange(params.k_sim)) & 1
                hamming = (empty_bits[:, None, :] != bits[None, :, :]).sum(axis=-1)
                sums[empty] = vectors[hamming.argmin(axis=1)]
        parts.append((sums @ projection).ravel())
    return np.concatenate(parts)


def cosine(first: np.ndarray, second: np.ndarray) -> float:
    """Cosine similarity of two vectors: 1 for the same direction, 0 for orthogonal ones."""
    first, second = np.asarray(first, np.float32), np.asarray(second, np.float32)
    return float(first @ second / max(float(np.linalg.norm(first) * np.linalg.norm(second)), 1e-12))


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    """Late-interaction score: for each query vector its best dot product with a document vector, summed."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    return float((np.asarray(query, np.float32) @ np.asarray(document, np.float32).T).max(axis=1).sum())
