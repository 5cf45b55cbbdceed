"""How far a reduced-precision path's vectors are from float32's: the quality bar of issue 25.

Two checks. The cosine of every bulk text's vector to its float32 one (the
minimum is the bar, not the mean). And the nearest neighbours of a small
retrieval set of real English: the paragraphs of Python's own documentation
that ship with the interpreter (`pydoc_data.topics`) as the corpus, the first
sentence of 100 of them, evenly spread (every fifth), as queries, each query's top K by cosine from
the reduced vectors against the float32 ones. Random-word texts would not do
for that: their neighbours are near-ties that any rounding reorders.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

K = 10
QUERIES = 100
MIN_COSINE = 0.999
# Cosines this close to a query's k-th neighbour's (in float32) count as a tie with it.
TIE = 1e-3


def retrieval_set(queries: int = QUERIES) -> tuple[list[str], list[str]]:
    """(queries, corpus): the distinct paragraphs of 200-1,200 characters in pydoc_data's topics, whitespace
    collapsed, and the first sentence of `queries` of them, evenly spread."""
    from pydoc_data.topics import topics

    corpus: list[str] = []
    seen: set[str] = set()
    for topic in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[topic]):
            text = " ".join(paragraph.split())
            if 200 < len(text) < 1200 and not paragraph.lstrip().startswith(">>>") and text not in seen:
                seen.add(text)  # topics repeat paragraphs: a copy would tie with itself at any precision
                corpus.append(text)
    step = max(1, len(corpus) // queries)
    firsts = [re.split(r"(?<=[.:])\s", corpus[index], maxsplit=1)[0] for index in range(0, len(corpus), step)]
    return firsts[:queries], corpus


def _normalized(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    return vectors / np.clip(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12, None)


def cosines(reference: np.ndarray, reduced: np.ndarray) -> dict[str, Any]:
    """`reduced` against `reference` (float32), row for row: the smallest and the mean cosine."""
    if reference.shape != reduced.shape:
        raise ValueError(f"shapes differ: {reference.shape} against {reduced.shape}")
    row_cosines = (_normalized(reference) * _normalized(reduced)).sum(axis=1)
    return {"texts": len(reference), "min_cosine": float(row_cosines.min()), "mean_cosine": float(row_cosines.mean())}


def top_k(queries: np.ndarray, corpus: np.ndarray, k: int = K) -> np.ndarray:
    """Each query's `k` nearest corpus rows by cosine, nearest first (ties to the lower index)."""
    similarity = _normalized(queries) @ _normalized(corpus).T
    return np.argsort(-similarity, axis=1, kind="stable")[:, :k]


def neighbours(reference: tuple[np.ndarray, np.ndarray], reduced: tuple[np.ndarray, np.ndarray], k: int = K) -> dict[str, Any]:
    """How many queries keep their float32 top `k` (as a set, and in order) with the reduced (queries, corpus)."""
    expected, got = top_k(*reference, k), top_k(*reduced, k)
    same_set = sum(set(a) == set(b) for a, b in zip(expected.tolist(), got.tolist(), strict=True))
    # A query whose set changed only by documents that float32 itself scores within TIE of its k-th: a near-tie
    # that rounding may break either way, told apart from a neighbour that really moved.
    similarity = _normalized(reference[0]) @ _normalized(reference[1]).T
    kth = similarity[np.arange(len(expected)), expected[:, -1]]
    near_ties = sum(
        set(a) != set(b) and all(abs(similarity[row, index] - kth[row]) <= TIE for index in set(a) ^ set(b))
        for row, (a, b) in enumerate(zip(expected.tolist(), got.tolist(), strict=True))
    )
    return {
        "queries": len(expected),
        "corpus": len(reference[1]),
        "k": k,
        "same_top_k_set": int(same_set),
        "same_top_k_order": int((expected == got).all(axis=1).sum()),
        "changed_by_near_ties_only": int(near_ties),
        "near_tie": TIE,
    }
