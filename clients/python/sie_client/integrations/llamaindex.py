"""LlamaIndex classes backed by the engine (`pip install sie[llamaindex]`).

SIEEmbedding is an embedding model; SIERerank a node postprocessor (what a query engine's
`node_postprocessors` run on retrieved nodes); SIEEntityExtractor a metadata extractor
(a transformation of an IngestionPipeline), which is how LlamaIndex enriches nodes before
they are embedded and stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.extractors import BaseExtractor
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle
from pydantic import PrivateAttr

from sie_client.client import AsyncSIEClient
from sie_client.integrations._common import DENSE, rerank
from sie_client.sync_client import SIEClient


class SIEEmbedding(BaseEmbedding):
    """Texts are encoded as documents, queries with `is_query=True`."""

    target: str
    dims: int | None = None
    _client: SIEClient = PrivateAttr()
    _client_options: dict[str, Any] = PrivateAttr()

    def __init__(self, target: str, model_name: str, *, dims: int | None = None, **client_options: Any) -> None:
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(target=target, model_name=model_name, dims=dims)  # type: ignore[call-arg]
        self._client_options = client_options
        self._client = SIEClient(target, **client_options)

    @classmethod
    def class_name(cls) -> str:
        return "SIEEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._client.encode(self.model_name, query, is_query=True, dims=self.dims, output_types=DENSE)[
            "dense"
        ].tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._client.encode(self.model_name, text, dims=self.dims, output_types=DENSE)["dense"].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [
            r["dense"].tolist() for r in self._client.encode(self.model_name, texts, dims=self.dims, output_types=DENSE)
        ]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        async with AsyncSIEClient(self.target, **self._client_options) as client:
            return (await client.encode(self.model_name, query, is_query=True, dims=self.dims, output_types=DENSE))[
                "dense"
            ].tolist()

    async def _aget_text_embedding(self, text: str) -> list[float]:
        async with AsyncSIEClient(self.target, **self._client_options) as client:
            return (await client.encode(self.model_name, text, dims=self.dims, output_types=DENSE))["dense"].tolist()

    def close(self) -> None:
        self._client.close()


class SIERerank(BaseNodePostprocessor):
    """Keeps the `top_n` nodes the reranker scores best for the query, best first, each with the reranker's score."""

    model: str
    top_n: int | None = None
    _client: SIEClient = PrivateAttr()

    def __init__(self, target: str, model: str, *, top_n: int | None = None, **client_options: Any) -> None:
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(model=model, top_n=top_n)  # type: ignore[call-arg]
        self._client = SIEClient(target, **client_options)

    @classmethod
    def class_name(cls) -> str:
        return "SIERerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        if query_bundle is None:
            raise ValueError("SIERerank needs the query (query_bundle or query_str)")
        texts = [node.node.get_content(metadata_mode=MetadataMode.EMBED) for node in nodes]
        return [
            NodeWithScore(node=nodes[index].node, score=score)
            for index, score in rerank(self._client, self.model, query_bundle.query_str, texts, self.top_n)
        ]

    def close(self) -> None:
        self._client.close()


class SIEEntityExtractor(BaseExtractor):
    """Metadata `entities`: the distinct entity texts the extractor finds in each node, in order of appearance.

    Flat strings, like LlamaIndex's own entity extractor, so every vector store can keep and filter them.
    """

    target: str
    model: str
    labels: list[str] | None = None
    threshold: float | None = None
    _client_options: dict[str, Any] = PrivateAttr()

    def __init__(
        self,
        target: str,
        model: str,
        *,
        labels: Sequence[str] | None = None,
        threshold: float | None = None,
        **client_options: Any,
    ) -> None:
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(  # type: ignore[call-arg]
            target=target, model=model, labels=list(labels) if labels is not None else None, threshold=threshold
        )
        self._client_options = client_options

    @classmethod
    def class_name(cls) -> str:
        return "SIEEntityExtractor"

    async def aextract(self, nodes: Sequence[BaseNode]) -> list[dict[str, Any]]:
        texts = [node.get_content(metadata_mode=MetadataMode.NONE) for node in nodes]
        if not texts:
            return []
        async with AsyncSIEClient(self.target, **self._client_options) as client:
            results = await client.extract(self.model, texts, labels=self.labels, threshold=self.threshold)
        return [
            {"entities": list(dict.fromkeys(entity["text"] for entity in result["entities"]))} for result in results
        ]
