"""LangChain classes backed by the engine (the `langchain` extra of sie-client:
`pip install ./contract/python './clients/python[langchain]'`).

SIEEmbeddings is an `Embeddings`; SIEReranker a document compressor (what
ContextualCompressionRetriever takes to rerank what a retriever found);
SIEEntityExtractor a document transformer that adds the entities of each document to
its metadata, the interface LangChain gives to steps that enrich documents before indexing.

Each holds one SIEClient: the blocking methods call it, the async ones (`aembed_*`, `acompress_documents`,
`atransform_documents`) await it on the caller's event loop, over the same channel; none hands work to a thread
pool. `base_url` is the client's (else SIE_BASE_URL); other keyword arguments go to SIEClient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sie_client.extras import needs_extra
from sie_client.integrations._common import DENSE, arerank, client_for, required_model, rerank
from sie_client.sync_client import SIEClient
from sie_client.types import EncodeResult, ExtractResult
from sie_client.verbs import EncodeOptions, ExtractOptions

with needs_extra("sie_client.integrations.langchain", "langchain", "langchain_core"):
    from langchain_core.callbacks import Callbacks
    from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
    from langchain_core.embeddings import Embeddings
    from pydantic import ConfigDict, PrivateAttr


class SIEEmbeddings(Embeddings):
    """Documents are encoded as documents, queries with `is_query=True`. `show_progress=True` shows a tqdm bar of
    the texts embedded by `embed_documents` (the client's `progress` extra)."""

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        dims: int | None = None,
        show_progress: bool = False,
        **client_options: Any,
    ) -> None:
        self.model = required_model(model, "SIEEmbeddings")
        self.dims = dims
        self.show_progress = show_progress
        self._client = client_for("SIEEmbeddings", base_url, client_options)

    def _options(self, *, is_query: bool) -> EncodeOptions:
        return {"is_query": is_query, "dims": self.dims, "output_types": DENSE, "progress": self.show_progress}

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return _vectors(self._client.encode(self.model, list(texts), **self._options(is_query=False)))

    def embed_query(self, text: str) -> list[float]:
        return self._client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE)[
            "dense"
        ].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        options = self._options(is_query=False)
        return _vectors(await self._client.run_async(lambda client: client.encode(self.model, list(texts), **options)))

    async def aembed_query(self, text: str) -> list[float]:
        result = await self._client.run_async(
            lambda client: client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE)
        )
        return result["dense"].tolist()

    def close(self) -> None:
        self._client.close()


def _vectors(results: list[EncodeResult]) -> list[list[float]]:
    return [result["dense"].tolist() for result in results]


class SIEReranker(BaseDocumentCompressor):
    """Keeps the `top_n` documents the reranker scores best for the query, best first, with `relevance_score` in
    metadata."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_url: str | None
    model: str
    top_n: int | None = None
    _client: SIEClient = PrivateAttr()

    def __init__(
        self, base_url: str | None = None, model: str | None = None, *, top_n: int | None = None, **client_options: Any
    ) -> None:
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(base_url=base_url, model=required_model(model, "SIEReranker"), top_n=top_n)  # type: ignore[call-arg]
        self._client = client_for("SIEReranker", base_url, client_options)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        texts = [document.page_content for document in documents]
        return _ranked(documents, rerank(self._client, self.model, query, texts, self.top_n))

    async def acompress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        texts = [document.page_content for document in documents]
        return _ranked(documents, await arerank(self._client, self.model, query, texts, self.top_n))

    def close(self) -> None:
        self._client.close()


def _ranked(documents: Sequence[Document], ranking: list[tuple[int, float]]) -> list[Document]:
    return [
        Document(
            page_content=documents[index].page_content,
            metadata={**documents[index].metadata, "relevance_score": score},
            id=documents[index].id,
        )
        for index, score in ranking
    ]


class SIEEntityExtractor(BaseDocumentTransformer):
    """Copies of the documents with `metadata["entities"]`: the extractor's spans (text, label, score, start, end).
    `show_progress=True` shows a tqdm bar of the documents done."""

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        labels: Sequence[str] | None = None,
        threshold: float | None = None,
        show_progress: bool = False,
        **client_options: Any,
    ) -> None:
        self.model = required_model(model, "SIEEntityExtractor")
        self.labels = list(labels) if labels is not None else None
        self.threshold = threshold
        self.show_progress = show_progress
        self._client = client_for("SIEEntityExtractor", base_url, client_options)

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> Sequence[Document]:
        texts = [document.page_content for document in documents]
        return _with_entities(documents, self._client.extract(self.model, texts, **self._options()))

    async def atransform_documents(self, documents: Sequence[Document], **kwargs: Any) -> Sequence[Document]:
        texts = [document.page_content for document in documents]
        options = self._options()
        return _with_entities(
            documents, await self._client.run_async(lambda client: client.extract(self.model, texts, **options))
        )

    def _options(self) -> ExtractOptions:
        return {"labels": self.labels, "threshold": self.threshold, "progress": self.show_progress}

    def close(self) -> None:
        self._client.close()


def _with_entities(documents: Sequence[Document], results: list[ExtractResult]) -> list[Document]:
    return [
        Document(
            page_content=document.page_content,
            metadata={**document.metadata, "entities": [dict(entity) for entity in result["entities"]]},
            id=document.id,
        )
        for document, result in zip(documents, results, strict=True)
    ]
