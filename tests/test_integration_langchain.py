"""sie_client.integrations.langchain follows LangChain's conventions, checked through langchain-core against a real
worker: the async methods are async (one connection, reused, counted by a relay; nothing handed to a thread), a
progress option shows a bar, and the server is `base_url=` as in the client.

The relay counts connections: grpc lets channels to one target that are open at once share one, so the calls go one
after another, where a channel per call would open a connection each time."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from client_observation import (
    EMBEDDER,
    EXTRACTOR,
    RERANKER,
    EngineAnswers,
    ThreadHandoffs,
    connection_counter,
    engine_answers,
    answered_since,
    requests_answered,
)

MODEL = EMBEDDER
TEXTS = ["the cat sat on the mat", "Angela Merkel met Emmanuel Macron in Paris", "plants need light to grow"]
QUERY = "where did the cat sit?"


@pytest.fixture(scope="module")
def expected(worker) -> EngineAnswers:
    return engine_answers(worker.address, TEXTS, QUERY)


async def test_async_embeddings_reuse_one_connection(worker, expected) -> None:
    from sie_client.integrations.langchain import SIEEmbeddings

    handoffs = ThreadHandoffs()
    asyncio.get_running_loop().set_default_executor(handoffs)
    with connection_counter(worker.address) as relay:
        embeddings = SIEEmbeddings(relay.address, MODEL)
        try:
            for _ in range(5):
                np.testing.assert_allclose(await embeddings.aembed_documents(TEXTS), expected.documents, atol=1e-5)
                np.testing.assert_allclose(await embeddings.aembed_query(QUERY), expected.query, atol=1e-5)
            many = await asyncio.gather(*(embeddings.aembed_query(QUERY) for _ in range(20)))
            np.testing.assert_allclose(many, [expected.query] * 20, atol=1e-5)
            np.testing.assert_allclose(embeddings.embed_query(QUERY), expected.query, atol=1e-5)  # the same channel
        finally:
            embeddings.close()
        assert relay.accepted == 1
    assert handoffs.submitted == 0


def test_async_embeddings_from_several_event_loops(worker, expected) -> None:
    """A grpc.aio channel belongs to the loop that made it: each asyncio.run is a new loop, and the calls still work
    over the one client."""
    from sie_client.integrations.langchain import SIEEmbeddings

    with connection_counter(worker.address) as relay:
        embeddings = SIEEmbeddings(relay.address, MODEL)
        try:
            for _ in range(3):
                np.testing.assert_allclose(asyncio.run(embeddings.aembed_query(QUERY)), expected.query, atol=1e-5)
        finally:
            embeddings.close()
        assert relay.accepted == 1


async def test_async_rerank_and_transform_do_not_fall_back_to_threads(worker, expected) -> None:
    from langchain_core.documents import Document

    from sie_client.integrations.langchain import SIEEntityExtractor, SIEReranker

    handoffs = ThreadHandoffs()
    asyncio.get_running_loop().set_default_executor(handoffs)
    documents = [Document(page_content=text, metadata={"n": n}, id=str(n)) for n, text in enumerate(TEXTS)]
    with connection_counter(worker.address) as relay:
        reranker = SIEReranker(relay.address, RERANKER, top_n=2)
        extractor = SIEEntityExtractor(relay.address, EXTRACTOR)
        try:
            for _ in range(3):
                kept = await reranker.acompress_documents(documents, QUERY)
                assert [(d.id, d.metadata["n"]) for d in kept] == [(str(i), i) for i, _ in expected.ranking[:2]]
                assert [d.metadata["relevance_score"] for d in kept] == pytest.approx(
                    [score for _, score in expected.ranking[:2]], abs=1e-6
                )
                enriched = await extractor.atransform_documents(documents)
                assert [d.metadata["entities"] for d in enriched] == expected.entities
                assert [d.id for d in enriched] == ["0", "1", "2"]
            assert await reranker.acompress_documents([], QUERY) == []
            assert await extractor.atransform_documents([]) == []
        finally:
            reranker.close()
            extractor.close()
        assert relay.accepted == 1
    assert handoffs.submitted == 0


def test_show_progress_draws_a_bar_of_the_texts_embedded(worker, capsys) -> None:
    from sie_client.integrations.langchain import SIEEmbeddings

    texts = [f"text number {n}" for n in range(600)]  # three requests of the client's 256
    quiet, shown = SIEEmbeddings(worker.address, MODEL), SIEEmbeddings(worker.address, MODEL, show_progress=True)
    try:
        assert len(quiet.embed_documents(texts)) == 600
        assert capsys.readouterr().err == ""
        before = requests_answered(worker, MODEL, "encode")
        assert len(shown.embed_documents(texts)) == 600
        assert answered_since(worker, MODEL, "encode", before, 3) == 3
        bar = capsys.readouterr().err
        assert "encode" in bar and "600/600" in bar, bar
        assert len(asyncio.run(shown.aembed_documents(texts[:10]))) == 10
        assert "10/10" in capsys.readouterr().err
    finally:
        quiet.close()
        shown.close()


def test_base_url_as_the_client_takes_it(worker, expected, monkeypatch) -> None:
    from sie_client.integrations.langchain import SIEEmbeddings, SIEReranker

    embeddings = SIEEmbeddings(base_url=f"http://{worker.address}", model=MODEL)
    try:
        np.testing.assert_allclose(embeddings.embed_query(QUERY), expected.query, atol=1e-5)
    finally:
        embeddings.close()
    monkeypatch.setenv("SIE_BASE_URL", f"http://{worker.address}")
    reranker = SIEReranker(model=RERANKER)  # the server from SIE_BASE_URL
    try:
        assert reranker.base_url is None and reranker.compress_documents([], QUERY) == []
    finally:
        reranker.close()
    monkeypatch.delenv("SIE_BASE_URL")
    with pytest.raises(ValueError, match=r"give the server as `base_url`"):
        SIEEmbeddings(model=MODEL)
    with pytest.raises(TypeError, match=r"SIEEmbeddings needs the model"):
        SIEEmbeddings(worker.address)
    with pytest.raises(TypeError, match=r"SIEEmbeddings got an unexpected keyword argument 'show_progess'"):
        SIEEmbeddings(worker.address, MODEL, show_progess=True)
