"""Haystack components backed by the engine (`pip install sie[haystack]`).

SIETextEmbedder embeds a query (`is_query=True`), SIEDocumentEmbedder embeds documents,
SIERanker orders documents by a reranker's score. Clients connect in `warm_up()`, which
Haystack pipelines call before the first run. `api_key` is a Haystack Secret (by default
the SIE_API_KEY environment variable, optional): a saved pipeline keeps the reference, not the key.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import Secret, deserialize_secrets_inplace

from sie_client.integrations._common import DENSE, rerank
from sie_client.sync_client import SIEClient


def _default_api_key() -> Secret:
    return Secret.from_env_var("SIE_API_KEY", strict=False)


class _Connected:
    """A client connected on first use (or by warm_up), closed by close(); (de)serialisation with the secret."""

    def __init__(self, target: str, model: str, api_key: Secret | None) -> None:
        self.target = target
        self.model = model
        self.api_key = api_key if api_key is not None else _default_api_key()
        self._client: SIEClient | None = None

    def warm_up(self) -> None:
        if self._client is None:
            self._client = SIEClient(self.target, api_key=self.api_key.resolve_value())

    @property
    def client(self) -> SIEClient:
        self.warm_up()
        assert self._client is not None
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _parameters(self) -> dict[str, Any]:
        """The init parameters besides target, model and api_key."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self, target=self.target, model=self.model, api_key=self.api_key.to_dict(), **self._parameters()
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)


@component
class SIETextEmbedder(_Connected):
    """Embeds one query string."""

    def __init__(self, target: str, model: str, *, dims: int | None = None, api_key: Secret | None = None) -> None:
        _Connected.__init__(self, target, model, api_key)  # @component rebuilds the class: zero-argument super() breaks
        self.dims = dims

    def _parameters(self) -> dict[str, Any]:
        return {"dims": self.dims}

    @component.output_types(embedding=list[float], meta=dict[str, Any])
    def run(self, text: str) -> dict[str, Any]:
        vector = self.client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE)["dense"]
        return {"embedding": vector.tolist(), "meta": {"model": self.model}}


@component
class SIEDocumentEmbedder(_Connected):
    """Sets `embedding` on copies of the documents, encoded as documents."""

    def __init__(self, target: str, model: str, *, dims: int | None = None, api_key: Secret | None = None) -> None:
        _Connected.__init__(self, target, model, api_key)
        self.dims = dims

    def _parameters(self) -> dict[str, Any]:
        return {"dims": self.dims}

    @component.output_types(documents=list[Document], meta=dict[str, Any])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        texts = [document.content or "" for document in documents]
        results = self.client.encode(self.model, texts, dims=self.dims, output_types=DENSE) if texts else []
        embedded = [
            dataclasses.replace(document, embedding=result["dense"].tolist())
            for document, result in zip(documents, results, strict=True)
        ]
        return {"documents": embedded, "meta": {"model": self.model}}


@component
class SIERanker(_Connected):
    """Orders documents by the reranker's score for the query (best first), each with its `score` set."""

    def __init__(self, target: str, model: str, *, top_k: int | None = None, api_key: Secret | None = None) -> None:
        _Connected.__init__(self, target, model, api_key)
        self.top_k = top_k

    def _parameters(self) -> dict[str, Any]:
        return {"top_k": self.top_k}

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        texts = [document.content or "" for document in documents]
        ranking = rerank(self.client, self.model, query, texts, top_k if top_k is not None else self.top_k)
        return {"documents": [dataclasses.replace(documents[index], score=score) for index, score in ranking]}
