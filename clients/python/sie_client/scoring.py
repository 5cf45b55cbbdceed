"""Client-side scoring of multivector (late-interaction, ColBERT-style) embeddings: encode documents once, store
their multivectors, and score a query against them here.

MaxSim: for each query token its best dot product over the document's tokens, summed. With normalized token vectors
(as the colbert adapter returns) each dot product is a cosine similarity. Accumulated in float32 whatever the
inputs' dtype (float16 multivectors included)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _multivector(array: object, label: str) -> np.ndarray:
    """`array` as a float32 (tokens, dims) matrix with at least one token, or a ValueError naming `label`."""
    matrix = np.asarray(array, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(
            f"{label} must be a 2-D (tokens, dims) array, not shape {matrix.shape}; wrap a single vector as "
            f"vector[None, :], and pass a list of documents as `documents`"
        )
    if matrix.shape[0] == 0:
        raise ValueError(f"{label} has no tokens (shape {matrix.shape}): MaxSim has nothing to match")
    return matrix


def _score(query: np.ndarray, document: np.ndarray, label: str) -> float:
    if document.shape[1] != query.shape[1]:
        raise ValueError(
            f"{label} is (tokens, {document.shape[1]}) but the query is (tokens, {query.shape[1]}): both must come "
            "from one model"
        )
    return float((query @ document.T).max(axis=1).sum())


def maxsim(query: np.ndarray, documents: np.ndarray | Sequence[np.ndarray]) -> list[float]:
    """The MaxSim score of `query` (tokens, dims) against each document: a list of (tokens, dims) matrices, a
    (documents, tokens, dims) stack, or one (tokens, dims) matrix (a list of one score)."""
    matrices = [documents] if isinstance(documents, np.ndarray) and documents.ndim == 2 else list(documents)
    q = _multivector(query, "query")
    return [
        _score(q, _multivector(document, f"documents[{index}]"), f"documents[{index}]")
        for index, document in enumerate(matrices)
    ]


def maxsim_batch(queries: Sequence[np.ndarray], documents: Sequence[np.ndarray]) -> np.ndarray:
    """MaxSim of each query against each document: a float32 (queries, documents) matrix."""
    prepared = [_multivector(query, f"queries[{index}]") for index, query in enumerate(queries)]
    scores = np.zeros((len(prepared), len(documents)), dtype=np.float32)
    for column, document in enumerate(documents):  # each document converted once, not once per query
        matrix = _multivector(document, f"documents[{column}]")
        for row, query in enumerate(prepared):
            scores[row, column] = _score(query, matrix, f"documents[{column}]")
    return scores
