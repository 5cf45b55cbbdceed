"""Haystack components backed by the engine (`pip install sie[haystack]`).

SIETextEmbedder embeds a query (`is_query=True`), SIEDocumentEmbedder embeds documents,
SIERanker orders documents by a reranker's score. Clients connect in `warm_up()`, which
Haystack pipelines call before the first run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from haystack import Document, component, default_to_dict

from sie_client.integrations._common import rerank
from sie_client.sync_client import SIEClient


class _Connected:
    """A client connected on first use (or by warm_up), closed by close()."""

    target: str
    model: str
    _client: SIEClient | None

    def warm_up(self) -> None:
        if self._client is None:
            self._client = SIEClient(self.target)

    @property
    def client(self) -> SIEClient:
        self.warm_up()
        assert self._client is not None
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


@component
class SIETextEmbedder(_Connected):
    """Embeds one query string."""

    def __init__(self, target: str, model: str, *, dims: int | None = None) -> None:
        self.target = target
        self.model = model
        self.dims = dims
        self._client = None

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, target=self.target, model=self.model, dims=self.dims)

    @component.output_types(embedding=list[float], meta=dict[str, Any])
    def run(self, text: str) -> dict[str, Any]:
        vector = self.client.encode(self.model, text, is_query=True, dims=self.dims)["dense"]
        return {"embedding": vector.tolist(), "meta": {"model": self.model}}


@component
class SIEDocumentEmbedder(_Connected):
    """Sets `embedding` on copies of the documents, encoded as documents."""

    def __init__(self, target: str, model: str, *, dims: int | None = None) -> None:
        self.target = target
        self.model = model
        self.dims = dims
        self._client = None

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, target=self.target, model=self.model, dims=self.dims)

    @component.output_types(documents=list[Document], meta=dict[str, Any])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        texts = [document.content or "" for document in documents]
        results = self.client.encode(self.model, texts, dims=self.dims) if texts else []
        embedded = [dataclasses.replace(document, embedding=result["dense"].tolist()) for document, result in zip(documents, results, strict=True)]
        return {"documents": embedded, "meta": {"model": self.model}}


@component
class SIERanker(_Connected):
    """Orders documents by the reranker's score for the query (best first), each with its `score` set."""

    def __init__(self, target: str, model: str, *, top_k: int | None = None) -> None:
        self.target = target
        self.model = model
        self.top_k = top_k
        self._client = None

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(self, target=self.target, model=self.model, top_k=self.top_k)

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        ranking = rerank(
            self.client,
            self.model,
            query,
            [document.content or "" for document in documents],
            top_k if top_k is not None else self.top_k,
        )
        return {"documents": [dataclasses.replace(documents[index], score=score) for index, score in ranking]}
