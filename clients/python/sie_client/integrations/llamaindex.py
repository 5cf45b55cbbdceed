"""LlamaIndex embedding model backed by the engine (`pip install sie[llamaindex]`)."""

from __future__ import annotations

from typing import Any

from llama_index.core.base.embeddings.base import BaseEmbedding
from pydantic import PrivateAttr

from sie_client.client import AsyncSIEClient
from sie_client.sync_client import SIEClient


class SIEEmbedding(BaseEmbedding):
    """Texts are encoded as documents, queries with `is_query=True`."""

    target: str
    dims: int | None = None
    _client: SIEClient = PrivateAttr()
    _client_options: dict[str, Any] = PrivateAttr()

    def __init__(self, target: str, model_name: str, *, dims: int | None = None, **client_options: Any) -> None:
        super().__init__(target=target, model_name=model_name, dims=dims)
        self._client_options = client_options
        self._client = SIEClient(target, **client_options)

    @classmethod
    def class_name(cls) -> str:
        return "SIEEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._client.encode(self.model_name, query, is_query=True, dims=self.dims)["dense"].tolist()

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._client.encode(self.model_name, text, dims=self.dims)["dense"].tolist()

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [r["dense"].tolist() for r in self._client.encode(self.model_name, texts, dims=self.dims)]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        async with AsyncSIEClient(self.target, **self._client_options) as client:
            return (await client.encode(self.model_name, query, is_query=True, dims=self.dims))["dense"].tolist()

    async def _aget_text_embedding(self, text: str) -> list[float]:
        async with AsyncSIEClient(self.target, **self._client_options) as client:
            return (await client.encode(self.model_name, text, dims=self.dims))["dense"].tolist()

    def close(self) -> None:
        self._client.close()
