"""What the integrations share: the output they embed with, the model argument, and reranking over SIEClient
(LangChain, LlamaIndex and Haystack rerankers), blocking and async.

Each integration object holds one SIEClient: its blocking methods call it, its async ones await it through
`SIEClient.run_async`, so both go over the client's one channel, from whatever event loop the framework runs."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from sie_client.connection import Connection
from sie_client.sync_client import SIEClient
from sie_client.types import ScoreResult

# Vector stores take dense vectors: asked for by name, whatever output a model gives by default (a ColBERT
# model's is its multivector; its dense output is the MUVERA encoding).
DENSE = ("dense",)


# What SIEClient takes by keyword.
CLIENT_ARGUMENTS = frozenset(inspect.signature(Connection.__init__).parameters) - {"self"}


def client_for(owner: str, base_url: str | None, options: Mapping[str, Any]) -> SIEClient:
    """The SIEClient of an integration object. An option that is not SIEClient's is a TypeError naming the
    integration, not the client's constructor (whose name would leave the caller guessing)."""
    for name in options:
        if name not in CLIENT_ARGUMENTS:
            raise TypeError(
                f"{owner} got an unexpected keyword argument {name!r}: it takes its own arguments and SIEClient's "
                "(docs/client.md, Construction)"
            )
    return SIEClient(base_url, **options)


def required_model(model: str | None, owner: str) -> str:
    """The model an integration was given: `base_url` may be left to SIE_BASE_URL, the model may not."""
    if not model:
        raise TypeError(f"{owner} needs the model: {owner}(base_url, model) or {owner}(model=...)")
    return model


def rerank(
    client: SIEClient, model: str, query: str, texts: Sequence[str], top_k: int | None = None
) -> list[tuple[int, float]]:
    """(index into `texts`, score) pairs, best first; no request for an empty list."""
    if not texts:
        return []
    return _ranking(client.score(model, query, list(texts), top_k=top_k))


async def arerank(
    client: SIEClient, model: str, query: str, texts: Sequence[str], top_k: int | None = None
) -> list[tuple[int, float]]:
    """rerank, awaited on the caller's event loop."""
    if not texts:
        return []
    return _ranking(await client.run_async(lambda engine: engine.score(model, query, list(texts), top_k=top_k)))


def _ranking(result: ScoreResult) -> list[tuple[int, float]]:
    return [(entry["index"], entry["score"]) for entry in result["scores"]]
