"""Client-side scoring of multivector (late-interaction, ColBERT-style) embeddings."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def maxsim(query: np.ndarray, documents: np.ndarray | Sequence[np.ndarray]) -> float | np.ndarray:
    """Late-interaction relevance: for each query token its best dot product over the document's tokens, summed.

    `query` is (query_tokens, dims); `documents` one (tokens, dims) matrix, giving a float, or a list of them,
    giving one score per document. Normalized token vectors (as the colbert adapter returns) make each dot
    product a cosine similarity."""
    q = np.asarray(query, dtype=np.float32)
    if q.ndim != 2:
        raise ValueError(f"query must be (tokens, dims), not shape {q.shape}")

    def one(document: np.ndarray) -> float:
        d = np.asarray(document, dtype=np.float32)
        if d.ndim != 2 or d.shape[1] != q.shape[1]:
            raise ValueError(f"a document must be (tokens, {q.shape[1]}), not shape {d.shape}")
        if d.shape[0] == 0:
            return 0.0
        return float((q @ d.T).max(axis=1).sum())

    if isinstance(documents, np.ndarray) and documents.ndim == 2:
        return one(documents)
    return np.asarray([one(document) for document in documents], dtype=np.float32)
