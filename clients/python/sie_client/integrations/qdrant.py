"""Qdrant named vectors from the engine: one dense and one sparse vector per point (the `qdrant` extra of
sie-client: `pip install ./contract/python './clients/python[qdrant]'`).

    vectors = SIEQdrantVectors("http://localhost:8080", dense_model="...", sparse_model="...")
    qdrant.create_collection("docs", **vectors.collection_config())
    qdrant.upsert("docs", vectors.points(texts, payloads=[{"text": t} for t in texts]))
    hits = qdrant.query_points("docs", **vectors.hybrid_query("question", limit=5)).points

Points are encoded as documents, queries with `is_query=True`. The hybrid query is two
prefetches (dense, sparse) fused by Qdrant's own fusion (RRF by default, or DBSF).
Every method has an async twin (`acollection_config`, `avectors`, `apoints`, `aquery_vectors`, `ahybrid_query`) for
AsyncQdrantClient: it awaits the same client on the caller's event loop and asks for the dense and sparse vectors
at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sie_client.async_client import AsyncSIEClient
from sie_client.extras import needs_extra
from sie_client.integrations._common import DENSE, client_for
from sie_client.types import EncodeResult

with needs_extra("sie_client.integrations.qdrant", "qdrant", "qdrant_client"):
    from qdrant_client import models

# What collection_config encodes to learn the dense model's width.
PROBE = "dimension probe"


class SIEQdrantVectors:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        dense_model: str,
        sparse_model: str,
        dense_name: str = "dense",
        sparse_name: str = "sparse",
        distance: models.Distance = models.Distance.COSINE,
        **client_options: Any,
    ) -> None:
        self.dense_model = dense_model
        self.sparse_model = sparse_model
        self.dense_name = dense_name
        self.sparse_name = sparse_name
        self.distance = distance
        self._client = client_for("SIEQdrantVectors", base_url, client_options)

    def collection_config(self) -> dict[str, Any]:
        """`vectors_config` and `sparse_vectors_config` for `create_collection`; the dense size is probed from the
        model."""
        return self._collection_config(self._client.encode(self.dense_model, PROBE, output_types=DENSE))

    async def acollection_config(self) -> dict[str, Any]:
        probe = await self._client.run_async(lambda client: client.encode(self.dense_model, PROBE, output_types=DENSE))
        return self._collection_config(probe)

    def _collection_config(self, probe: EncodeResult) -> dict[str, Any]:
        return {
            "vectors_config": {self.dense_name: models.VectorParams(size=len(probe["dense"]), distance=self.distance)},
            "sparse_vectors_config": {self.sparse_name: models.SparseVectorParams()},
        }

    def vectors(self, texts: Sequence[str], *, is_query: bool = False) -> list[dict[str, Any]]:
        """The named vectors of each text: {dense_name: [floats], sparse_name: SparseVector}."""
        if not texts:
            return []
        dense = self._client.encode(self.dense_model, list(texts), is_query=is_query, output_types=DENSE)
        sparse = self._client.encode(self.sparse_model, list(texts), is_query=is_query, output_types=["sparse"])
        return self._named(dense, sparse)

    async def avectors(self, texts: Sequence[str], *, is_query: bool = False) -> list[dict[str, Any]]:
        if not texts:
            return []

        async def both(client: AsyncSIEClient) -> tuple[list[EncodeResult], list[EncodeResult]]:
            return await asyncio.gather(
                client.encode(self.dense_model, list(texts), is_query=is_query, output_types=DENSE),
                client.encode(self.sparse_model, list(texts), is_query=is_query, output_types=["sparse"]),
            )

        return self._named(*await self._client.run_async(both))

    def _named(self, dense: list[EncodeResult], sparse: list[EncodeResult]) -> list[dict[str, Any]]:
        return [
            {self.dense_name: d["dense"].tolist(), self.sparse_name: _sparse_vector(s)}
            for d, s in zip(dense, sparse, strict=True)
        ]

    def points(
        self,
        texts: Sequence[str],
        *,
        ids: Sequence[int | str] | None = None,
        payloads: Sequence[dict[str, Any]] | None = None,
    ) -> list[models.PointStruct]:
        """One point per text (ids default to 0..n-1), encoded as documents."""
        return _points(texts, ids, payloads, self.vectors(texts))

    async def apoints(
        self,
        texts: Sequence[str],
        *,
        ids: Sequence[int | str] | None = None,
        payloads: Sequence[dict[str, Any]] | None = None,
    ) -> list[models.PointStruct]:
        return _points(texts, ids, payloads, await self.avectors(texts))

    def query_vectors(self, text: str) -> dict[str, Any]:
        """The query's named vectors, encoded with `is_query=True`; pass one to `query_points(query=...,
        using=name)`."""
        return self.vectors([text], is_query=True)[0]

    async def aquery_vectors(self, text: str) -> dict[str, Any]:
        return (await self.avectors([text], is_query=True))[0]

    def hybrid_query(
        self,
        text: str,
        *,
        limit: int = 10,
        prefetch_limit: int | None = None,
        fusion: models.Fusion = models.Fusion.RRF,
    ) -> dict[str, Any]:
        """Keyword arguments for `query_points`: a dense and a sparse prefetch, fused by Qdrant."""
        return self._hybrid(self.query_vectors(text), limit, prefetch_limit, fusion)

    async def ahybrid_query(
        self,
        text: str,
        *,
        limit: int = 10,
        prefetch_limit: int | None = None,
        fusion: models.Fusion = models.Fusion.RRF,
    ) -> dict[str, Any]:
        """Keyword arguments for AsyncQdrantClient's `query_points`."""
        return self._hybrid(await self.aquery_vectors(text), limit, prefetch_limit, fusion)

    def _hybrid(
        self, vectors: dict[str, Any], limit: int, prefetch_limit: int | None, fusion: models.Fusion
    ) -> dict[str, Any]:
        per_prefetch = prefetch_limit if prefetch_limit is not None else limit
        return {
            "prefetch": [
                models.Prefetch(query=vectors[self.dense_name], using=self.dense_name, limit=per_prefetch),
                models.Prefetch(query=vectors[self.sparse_name], using=self.sparse_name, limit=per_prefetch),
            ],
            "query": models.FusionQuery(fusion=fusion),
            "limit": limit,
        }

    def close(self) -> None:
        self._client.close()


def _points(
    texts: Sequence[str],
    ids: Sequence[int | str] | None,
    payloads: Sequence[dict[str, Any]] | None,
    vectors: list[dict[str, Any]],
) -> list[models.PointStruct]:
    ids = list(range(len(texts))) if ids is None else list(ids)
    payloads = [{} for _ in texts] if payloads is None else list(payloads)
    return [
        models.PointStruct(id=point_id, vector=vector, payload=payload)
        for point_id, vector, payload in zip(ids, vectors, payloads, strict=True)
    ]


def _sparse_vector(result: EncodeResult) -> models.SparseVector:
    sparse = result["sparse"]
    return models.SparseVector(indices=sparse["indices"].tolist(), values=sparse["values"].tolist())
