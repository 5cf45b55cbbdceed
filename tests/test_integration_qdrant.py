"""sie_client.integrations.qdrant has async twins for AsyncQdrantClient, checked against qdrant-client's local mode
and a real worker: the same vectors, points and hybrid results as the blocking methods, over one connection (a relay
counts them) and without handing work to threads."""

from __future__ import annotations

import asyncio

import pytest

from client_observation import ThreadHandoffs, connection_counter

DENSE_MODEL = "test/tiny-mean"
SPARSE_MODEL = "test/tiny-splade"
TEXTS = ["the cat slept on the windowsill", "revenue grew twelve percent", "knead the dough", "Jupiter is large"]
QUERY = "where did the cat sleep?"


async def test_async_twins_give_the_blocking_answers_over_one_connection(worker) -> None:
    from qdrant_client import AsyncQdrantClient, QdrantClient

    from sie_client.integrations.qdrant import SIEQdrantVectors

    handoffs = ThreadHandoffs()
    asyncio.get_running_loop().set_default_executor(handoffs)
    with connection_counter(worker.address) as relay:
        vectors = SIEQdrantVectors(relay.address, dense_model=DENSE_MODEL, sparse_model=SPARSE_MODEL)
        qdrant, local = AsyncQdrantClient(":memory:"), QdrantClient(":memory:")
        try:
            config = await vectors.acollection_config()
            assert config["vectors_config"]["dense"].size == 32
            assert await vectors.avectors([]) == []
            payloads = [{"text": text} for text in TEXTS]
            points = await vectors.apoints(TEXTS, ids=[10, 11, 12, 13], payloads=payloads)
            assert points == await asyncio.to_thread(vectors.points, TEXTS, ids=[10, 11, 12, 13], payloads=payloads)
            handed_to_the_check = handoffs.submitted
            assert [p.id for p in points] == [10, 11, 12, 13]
            assert await vectors.aquery_vectors(QUERY) == vectors.query_vectors(QUERY)

            await qdrant.create_collection("docs", **config)
            await qdrant.upsert("docs", points)
            local.create_collection("docs", **vectors.collection_config())
            local.upsert("docs", vectors.points(TEXTS, ids=[10, 11, 12, 13], payloads=payloads))
            for _ in range(3):
                hybrid = await qdrant.query_points("docs", **await vectors.ahybrid_query(QUERY, limit=4))
                expected = local.query_points("docs", **vectors.hybrid_query(QUERY, limit=4))
                assert [(p.id, p.score) for p in hybrid.points] == [
                    (p.id, pytest.approx(p.score, abs=1e-6)) for p in expected.points
                ]
                assert [p.payload for p in hybrid.points] == [p.payload for p in expected.points]
        finally:
            vectors.close()
            await qdrant.close()
            local.close()
        assert relay.accepted == 1
    assert handoffs.submitted == handed_to_the_check  # only the test's own to_thread
