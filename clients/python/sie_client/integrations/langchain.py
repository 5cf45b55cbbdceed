"""LangChain classes backed by the engine (`pip install sie[langchain]`).

SIEEmbeddings is an `Embeddings`; SIEReranker a document compressor (what
ContextualCompressionRetriever takes to rerank what a retriever found);
SIEEntityExtractor a document transformer that adds the entities of each document to
its metadata, the interface LangChain gives to steps that enrich documents before indexing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, BaseDocumentTransformer, Document
from langchain_core.embeddings import Embeddings
from pydantic import ConfigDict, PrivateAttr

from sie_client.client import AsyncSIEClient
from sie_client.integrations._common import DENSE, rerank
from sie_client.sync_client import SIEClient


class SIEEmbeddings(Embeddings):
    """Documents are encoded as documents, queries with `is_query=True`."""

    def __init__(self, target: str, model: str, *, dims: int | None = None, **client_options: Any) -> None:
        self.model = model
        self.dims = dims
        self._target = target
        self._client_options = client_options
        self._client = SIEClient(target, **client_options)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [r["dense"].tolist() for r in self._client.encode(self.model, texts, dims=self.dims, output_types=DENSE)]

    def embed_query(self, text: str) -> list[float]:
        return self._client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE)[
            "dense"
        ].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        async with AsyncSIEClient(self._target, **self._client_options) as client:
            return [
                r["dense"].tolist() for r in await client.encode(self.model, texts, dims=self.dims, output_types=DENSE)
            ]

    async def aembed_query(self, text: str) -> list[float]:
        async with AsyncSIEClient(self._target, **self._client_options) as client:
            return (await client.encode(self.model, text, is_query=True, dims=self.dims, output_types=DENSE))[
                "dense"
            ].tolist()

    def close(self) -> None:
        self._client.close()


class SIEReranker(BaseDocumentCompressor):
    """Keeps the `top_n` documents the reranker scores best for the query, best first, with `relevance_score` in
    metadata."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    target: str
    model: str
    top_n: int | None = None
    _client: SIEClient = PrivateAttr()

    def __init__(self, target: str, model: str, *, top_n: int | None = None, **client_options: Any) -> None:
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(target=target, model=model, top_n=top_n)  # type: ignore[call-arg]
        self._client = SIEClient(target, **client_options)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks | None = None
    ) -> Sequence[Document]:
        ranking = rerank(self._client, self.model, query, [document.page_content for document in documents], self.top_n)
        return [
            Document(
                page_content=documents[index].page_content,
                metadata={**documents[index].metadata, "relevance_score": score},
                id=documents[index].id,
            )
            for index, score in ranking
        ]

    def close(self) -> None:
        self._client.close()


class SIEEntityExtractor(BaseDocumentTransformer):
    """Copies of the documents with `metadata["entities"]`: the extractor's spans (text, label, score, start, end)."""

    def __init__(
        self,
        target: str,
        model: str,
        *,
        labels: Sequence[str] | None = None,
        threshold: float | None = None,
        **client_options: Any,
    ) -> None:
        self.model = model
        self.labels = list(labels) if labels is not None else None
        self.threshold = threshold
        self._client = SIEClient(target, **client_options)

    def transform_documents(self, documents: Sequence[Document], **kwargs: Any) -> Sequence[Document]:
        texts = [document.page_content for document in documents]
        results = self._client.extract(self.model, texts, labels=self.labels, threshold=self.threshold) if texts else []
        found = [[dict(entity) for entity in result["entities"]] for result in results]
        return [
            Document(
                page_content=document.page_content, metadata={**document.metadata, "entities": spans}, id=document.id
            )
            for document, spans in zip(documents, found, strict=True)
        ]

    def close(self) -> None:
        self._client.close()
