"""LangChain `Embeddings` backed by the engine (`pip install sie[langchain]`)."""

from __future__ import annotations

from typing import Any

from langchain_core.embeddings import Embeddings

from sie_client.client import AsyncSIEClient
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
        return [r["dense"].tolist() for r in self._client.encode(self.model, texts, dims=self.dims)]

    def embed_query(self, text: str) -> list[float]:
        return self._client.encode(self.model, text, is_query=True, dims=self.dims)["dense"].tolist()

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        async with AsyncSIEClient(self._target, **self._client_options) as client:
            return [r["dense"].tolist() for r in await client.encode(self.model, texts, dims=self.dims)]

    async def aembed_query(self, text: str) -> list[float]:
        async with AsyncSIEClient(self._target, **self._client_options) as client:
            return (await client.encode(self.model, text, is_query=True, dims=self.dims))["dense"].tolist()

    def close(self) -> None:
        self._client.close()
