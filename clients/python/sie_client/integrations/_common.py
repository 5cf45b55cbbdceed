"""What the integrations share: the output they embed with, and reranking over SIEClient (LangChain, LlamaIndex and
Haystack rerankers)."""

from __future__ import annotations

from collections.abc import Sequence

from sie_client.sync_client import SIEClient

# Vector stores take dense vectors: asked for by name, whatever output a model gives by default (a ColBERT
# model's is its multivector; its dense output is the MUVERA encoding).
DENSE = ("dense",)


def rerank(
    client: SIEClient, model: str, query: str, texts: Sequence[str], top_k: int | None = None
) -> list[tuple[int, float]]:
    """(index into `texts`, score) pairs, best first; no request for an empty list."""
    if not texts:
        return []
    result = client.score(model, query, list(texts), top_k=top_k)
    return [(entry["index"], entry["score"]) for entry in result["scores"]]
