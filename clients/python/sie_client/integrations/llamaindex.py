"""LlamaIndex classes backed by the engine (the `llamaindex` extra of sie-client:
`pip install ./contract/python './clients/python[llamaindex]'`).

SIEEmbedding is an embedding model; SIERerank a node postprocessor (what a query engine's
`node_postprocessors` run on retrieved nodes); SIEEntityExtractor a metadata extractor
(a transformation of an IngestionPipeline), which is how LlamaIndex enriches nodes before
they are embedded and stored.

Each holds one SIEClient: blocking calls use it, async ones await it on the caller's event loop over the same
channel (`SIEClient.run_async`), whichever loop LlamaIndex runs them on. `base_url` is the client's (else
SIE_BASE_URL); keyword arguments that are the LlamaIndex base class's fields (`embed_batch_size`,
`callback_manager`, `num_workers`, ...) go to it, the others to SIEClient.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sie_client.extras import needs_extra
from sie_client.integrations._common import DENSE, arerank, client_for, required_model, rerank
from sie_client.sync_client import SIEClient
from sie_client.types import ExtractResult

with needs_extra("sie_client.integrations.llamaindex", "llamaindex", "llama_index"):
    from llama_index.core.base.embeddings.base import BaseEmbedding
    from llama_index.core.extractors import BaseExtractor
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import BaseNode, MetadataMode, NodeWithScore, QueryBundle
    from pydantic import BaseModel, PrivateAttr


def _split(base: type[BaseModel], options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`options` as (the LlamaIndex base class's fields, the client's arguments)."""
    fields = {name: value for name, value in options.items() if name in base.model_fields}
    return fields, {name: value for name, value in options.items() if name not in fields}


class SIEEmbedding(BaseEmbedding):
    """Texts are encoded as documents, queries with `is_query=True`. LlamaIndex batches texts by `embed_batch_size`
    (default 10): each batch is one request, blocking or async (the client's `stream_batch_size` follows it unless
    given)."""

    base_url: str | None = None
    dims: int | None = None
    _client: SIEClient = PrivateAttr()

    def __init__(
        self, base_url: str | None = None, model_name: str | None = None, *, dims: int | None = None, **options: Any
    ) -> None:
        framework, client_options = _split(BaseEmbedding, options)
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(  # type: ignore[call-arg]
            base_url=base_url, model_name=required_model(model_name, "SIEEmbedding"), dims=dims, **framework
        )
        self._client = client_for(
            "SIEEmbedding", base_url, {"stream_batch_size": self.embed_batch_size, **client_options}
        )

    @classmethod
    def class_name(cls) -> str:
        return "SIEEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._get_embeddings([query], is_query=True)[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_embeddings([text], is_query=False)[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._get_embeddings(texts, is_query=False)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aget_embeddings([query], is_query=True))[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aget_embeddings([text], is_query=False))[0]

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await self._aget_embeddings(texts, is_query=False)

    def _get_embeddings(self, texts: list[str], *, is_query: bool) -> list[list[float]]:
        results = self._client.encode(self.model_name, texts, is_query=is_query, dims=self.dims, output_types=DENSE)
        return [result["dense"].tolist() for result in results]

    async def _aget_embeddings(self, texts: list[str], *, is_query: bool) -> list[list[float]]:
        results = await self._client.run_async(
            lambda client: client.encode(self.model_name, texts, is_query=is_query, dims=self.dims, output_types=DENSE)
        )
        return [result["dense"].tolist() for result in results]

    def close(self) -> None:
        self._client.close()


class SIERerank(BaseNodePostprocessor):
    """Keeps the `top_n` nodes the reranker scores best for the query, best first, each with the reranker's score."""

    base_url: str | None = None
    model: str
    top_n: int | None = None
    _client: SIEClient = PrivateAttr()

    def __init__(
        self, base_url: str | None = None, model: str | None = None, *, top_n: int | None = None, **options: Any
    ) -> None:
        framework, client_options = _split(BaseNodePostprocessor, options)
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(base_url=base_url, model=required_model(model, "SIERerank"), top_n=top_n, **framework)  # type: ignore[call-arg]
        self._client = client_for("SIERerank", base_url, client_options)

    @classmethod
    def class_name(cls) -> str:
        return "SIERerank"

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query, texts = _query_and_texts(nodes, query_bundle)
        return _ranked(nodes, rerank(self._client, self.model, query, texts, self.top_n))

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query, texts = _query_and_texts(nodes, query_bundle)
        return _ranked(nodes, await arerank(self._client, self.model, query, texts, self.top_n))

    def close(self) -> None:
        self._client.close()


def _query_and_texts(nodes: list[NodeWithScore], query_bundle: QueryBundle | None) -> tuple[str, list[str]]:
    if query_bundle is None:
        raise ValueError("SIERerank needs the query (query_bundle or query_str)")
    return query_bundle.query_str, [node.node.get_content(metadata_mode=MetadataMode.EMBED) for node in nodes]


def _ranked(nodes: list[NodeWithScore], ranking: list[tuple[int, float]]) -> list[NodeWithScore]:
    return [NodeWithScore(node=nodes[index].node, score=score) for index, score in ranking]


class SIEEntityExtractor(BaseExtractor):
    """Metadata `entities`: the distinct entity texts the extractor finds in each node, in order of appearance.

    Flat strings, like LlamaIndex's own entity extractor, so every vector store can keep and filter them.
    `show_progress` (LlamaIndex's field) shows a bar of the nodes done.
    """

    base_url: str | None = None
    model: str
    labels: list[str] | None = None
    threshold: float | None = None
    _client: SIEClient = PrivateAttr()

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        labels: Sequence[str] | None = None,
        threshold: float | None = None,
        **options: Any,
    ) -> None:
        framework, client_options = _split(BaseExtractor, options)
        # pydantic: mypy types this with the parent's fields, not this model's
        super().__init__(  # type: ignore[call-arg]
            base_url=base_url,
            model=required_model(model, "SIEEntityExtractor"),
            labels=list(labels) if labels is not None else None,
            threshold=threshold,
            **framework,
        )
        self._client = client_for("SIEEntityExtractor", base_url, client_options)

    @classmethod
    def class_name(cls) -> str:
        return "SIEEntityExtractor"

    async def aextract(self, nodes: Sequence[BaseNode]) -> list[dict[str, Any]]:
        texts = [node.get_content(metadata_mode=MetadataMode.NONE) for node in nodes]
        results: list[ExtractResult] = await self._client.run_async(
            lambda client: client.extract(
                self.model, texts, labels=self.labels, threshold=self.threshold, progress=self.show_progress
            )
        )
        return [
            {"entities": list(dict.fromkeys(entity["text"] for entity in result["entities"]))} for result in results
        ]

    def close(self) -> None:
        self._client.close()
