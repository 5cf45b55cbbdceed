"""Haystack components backed by the engine (the `haystack` extra of sie-client:
`pip install ./contract/python './clients/python[haystack]'`).

SIETextEmbedder embeds a query (`is_query=True`), SIEDocumentEmbedder embeds documents,
SIERanker orders documents by a reranker's score. Each has `run` and `run_async` (what an AsyncPipeline calls),
over one client: it connects in `warm_up()` (or `warm_up_async()`, or on first use), which Haystack pipelines call
before the first run. `api_key` is a Haystack Secret (by default the SIE_API_KEY environment variable, optional): a
saved pipeline keeps the reference, not the key.

The document embedder and the ranker take the parameters Haystack's own embedders define: `batch_size` (documents
per request), `progress_bar`, `meta_fields_to_embed` and `embedding_separator` (the text sent is the listed meta
values that are set, then the content, joined by the separator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sie_client.extras import needs_extra
from sie_client.integrations._common import DENSE, arerank, rerank
from sie_client.sync_client import SIEClient
from sie_client.types import EncodeResult

with needs_extra("sie_client.integrations.haystack", "haystack", "haystack"):
    from haystack import Document, component, default_from_dict, default_to_dict
    from haystack.utils import Secret, deserialize_secrets_inplace


def _default_api_key() -> Secret:
    return Secret.from_env_var("SIE_API_KEY", strict=False)


class _Connected:
    """A client connected on first use (or by warm_up), closed by close(); (de)serialisation with the secret."""

    def __init__(self, base_url: str | None, model: str, api_key: Secret | None) -> None:
        self.base_url = base_url
        self.model = model
        self.api_key = api_key if api_key is not None else _default_api_key()
        self._client: SIEClient | None = None

    def warm_up(self) -> None:
        if self._client is None:
            self._client = SIEClient(self.base_url, api_key=self.api_key.resolve_value(), **self._client_options())

    async def warm_up_async(self) -> None:
        """The same client as warm_up: it serves async runs on any event loop."""
        self.warm_up()

    def _client_options(self) -> dict[str, Any]:
        return {}

    @property
    def client(self) -> SIEClient:
        self.warm_up()
        assert self._client is not None
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    async def close_async(self) -> None:
        self.close()

    def _parameters(self) -> dict[str, Any]:
        """The init parameters besides base_url, model and api_key."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return default_to_dict(
            self, base_url=self.base_url, model=self.model, api_key=self.api_key.to_dict(), **self._parameters()
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Any:
        deserialize_secrets_inplace(data["init_parameters"], keys=["api_key"])
        return default_from_dict(cls, data)


class _DocumentTexts:
    """Haystack's `meta_fields_to_embed` and `embedding_separator`: the text of a document that is sent."""

    meta_fields_to_embed: list[str]
    embedding_separator: str

    def _texts(self, documents: Sequence[Document]) -> list[str]:
        return [
            self.embedding_separator.join(
                [
                    *(
                        str(document.meta[key])
                        for key in self.meta_fields_to_embed
                        if document.meta.get(key) is not None
                    ),
                    document.content or "",
                ]
            )
            for document in documents
        ]


@component
class SIETextEmbedder(_Connected):
    """Embeds one query string."""

    def __init__(
        self, base_url: str | None, model: str, *, dims: int | None = None, api_key: Secret | None = None
    ) -> None:
        # @component rebuilds the class: zero-argument super() breaks
        _Connected.__init__(self, base_url, model, api_key)
        self.dims = dims

    def _parameters(self) -> dict[str, Any]:
        return {"dims": self.dims}

    @component.output_types(embedding=list[float], meta=dict[str, Any])
    def run(self, text: str) -> dict[str, Any]:
        return self._answer(self.client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE))

    @component.output_types(embedding=list[float], meta=dict[str, Any])
    async def run_async(self, text: str) -> dict[str, Any]:
        result = await self.client.run_async(
            lambda client: client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE)
        )
        return self._answer(result)

    def _answer(self, result: EncodeResult) -> dict[str, Any]:
        return {"embedding": result["dense"].tolist(), "meta": {"model": self.model}}


@component
class SIEDocumentEmbedder(_Connected, _DocumentTexts):
    """Sets `embedding` on copies of the documents, encoded as documents: `batch_size` documents per request (the
    requests pipelined over one stream), a progress bar of the documents done unless `progress_bar=False`."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        *,
        dims: int | None = None,
        batch_size: int = 32,
        progress_bar: bool = True,
        meta_fields_to_embed: list[str] | None = None,
        embedding_separator: str = "\n",
        api_key: Secret | None = None,
    ) -> None:
        _Connected.__init__(self, base_url, model, api_key)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        self.dims = dims
        self.batch_size = batch_size
        self.progress_bar = progress_bar
        self.meta_fields_to_embed = list(meta_fields_to_embed or [])
        self.embedding_separator = embedding_separator

    def _client_options(self) -> dict[str, Any]:
        return {"stream_batch_size": self.batch_size}

    def _parameters(self) -> dict[str, Any]:
        return {
            "dims": self.dims,
            "batch_size": self.batch_size,
            "progress_bar": self.progress_bar,
            "meta_fields_to_embed": self.meta_fields_to_embed,
            "embedding_separator": self.embedding_separator,
        }

    @component.output_types(documents=list[Document], meta=dict[str, Any])
    def run(self, documents: list[Document]) -> dict[str, Any]:
        texts = self._texts(documents)
        results = self.client.encode(self.model, texts, dims=self.dims, output_types=DENSE, progress=self.progress_bar)
        return self._answer(documents, results)

    @component.output_types(documents=list[Document], meta=dict[str, Any])
    async def run_async(self, documents: list[Document]) -> dict[str, Any]:
        texts = self._texts(documents)
        results = await self.client.run_async(
            lambda client: client.encode(
                self.model, texts, dims=self.dims, output_types=DENSE, progress=self.progress_bar
            )
        )
        return self._answer(documents, results)

    def _answer(self, documents: list[Document], results: list[EncodeResult]) -> dict[str, Any]:
        embedded = [
            dataclasses.replace(document, embedding=result["dense"].tolist())
            for document, result in zip(documents, results, strict=True)
        ]
        return {"documents": embedded, "meta": {"model": self.model}}


@component
class SIERanker(_Connected, _DocumentTexts):
    """Orders documents by the reranker's score for the query (best first), each with its `score` set; the text
    scored is built as the document embedder's (`meta_fields_to_embed`, `embedding_separator`)."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        *,
        top_k: int | None = None,
        meta_fields_to_embed: list[str] | None = None,
        embedding_separator: str = "\n",
        api_key: Secret | None = None,
    ) -> None:
        _Connected.__init__(self, base_url, model, api_key)
        self.top_k = top_k
        self.meta_fields_to_embed = list(meta_fields_to_embed or [])
        self.embedding_separator = embedding_separator

    def _parameters(self) -> dict[str, Any]:
        return {
            "top_k": self.top_k,
            "meta_fields_to_embed": self.meta_fields_to_embed,
            "embedding_separator": self.embedding_separator,
        }

    @component.output_types(documents=list[Document])
    def run(self, query: str, documents: list[Document], top_k: int | None = None) -> dict[str, list[Document]]:
        ranking = rerank(self.client, self.model, query, self._texts(documents), self._top_k(top_k))
        return _ranked(documents, ranking)

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        ranking = await arerank(self.client, self.model, query, self._texts(documents), self._top_k(top_k))
        return _ranked(documents, ranking)

    def _top_k(self, top_k: int | None) -> int | None:
        return top_k if top_k is not None else self.top_k


def _ranked(documents: list[Document], ranking: list[tuple[int, float]]) -> dict[str, list[Document]]:
    return {"documents": [dataclasses.replace(documents[index], score=score) for index, score in ranking]}
