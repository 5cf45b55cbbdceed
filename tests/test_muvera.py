"""MUVERA fixed-dimensional encodings rank documents like MaxSim does."""

from __future__ import annotations

import numpy as np

from sie_worker.engine.postprocess import MuveraParams, maxsim, muvera


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


def test_fde_dot_products_rank_documents_like_maxsim() -> None:
    """40 documents of 20-40 random unit vectors; 20 queries of 6 vectors near document A's, 3 near B's (+ noise).

    Criterion (default parameters: k_sim 4, d_proj 16, 10 repetitions = 2560 dims): the FDE dot
    product picks MaxSim's best document for at least 18 of 20 queries, and MaxSim's best two for at
    least 15 of 20.
    """
    rng = np.random.default_rng(0)
    documents = [unit(rng.standard_normal((int(rng.integers(20, 40)), 32))) for _ in range(40)]
    queries = []
    for _ in range(20):
        a, b = rng.choice(len(documents), 2, replace=False)
        picked = np.concatenate(
            [documents[a][rng.choice(len(documents[a]), 6, replace=False)], documents[b][rng.choice(len(documents[b]), 3, replace=False)]]
        )
        queries.append(unit(picked + 0.05 * rng.standard_normal(picked.shape)))

    params = MuveraParams()
    exact = np.array([[maxsim(query, document) for document in documents] for query in queries])
    document_fdes = np.stack([muvera(document, params, is_query=False) for document in documents])
    query_fdes = np.stack([muvera(query, params, is_query=True) for query in queries])
    approx = query_fdes @ document_fdes.T

    assert document_fdes.shape[1] == params.dims == 2560
    top1 = int((exact.argmax(axis=1) == approx.argmax(axis=1)).sum())
    top2 = sum(set(exact[i].argsort()[-2:]) == set(approx[i].argsort()[-2:]) for i in range(len(queries)))
    assert top1 >= 18, f"top-1 agreement {top1}/20"
    assert top2 >= 15, f"top-2 agreement {top2}/20"


def test_fde_is_deterministic_for_a_seed() -> None:
    vectors = unit(np.random.default_rng(1).standard_normal((12, 16)))
    first = muvera(vectors, MuveraParams(seed=3), is_query=False)
    np.testing.assert_array_equal(first, muvera(vectors, MuveraParams(seed=3), is_query=False))
    assert not np.allclose(first, muvera(vectors, MuveraParams(seed=4), is_query=False))
