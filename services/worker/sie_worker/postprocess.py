"""After the forward pass: Matryoshka truncation, then the output dtype (always last)."""

from __future__ import annotations

import numpy as np

OUTPUT_DTYPES = ("float32", "float16")


def finish_dense(vectors: np.ndarray, *, dims: int | None, normalized: bool, dtype: str) -> np.ndarray:
    """Rows of `vectors` cut to `dims` (renormalized when the model normalizes) in `dtype`."""
    if dims is not None and dims < vectors.shape[1]:
        vectors = vectors[:, :dims]
        if normalized:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
    return vectors.astype(np.dtype(dtype), copy=False)
