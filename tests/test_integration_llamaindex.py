"""sie_client.integrations.llamaindex follows LlamaIndex's conventions, checked through LlamaIndex itself against a
real worker: `embed_batch_size` is one request per batch (the worker's request counter), async embedding, reranking
and extraction reuse one connection (a relay counts them) and hand nothing to threads, and the framework's own
arguments go to the framework, the client's to the client.

Connections, not channels, are what the relay counts: grpc lets channels to one target that are open at once share
a connection, so the tests make their calls one after another, where a channel per call (opened, used, closed)
would open a connection each time."""

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
TEXTS = [f"document number {n} is about topic {n % 3}" for n in range(10)]
QUERY = "which document is about topic one?"


@pytest.fixture(scope="module")
def expected(worker) -> EngineAnswers:
    return engine_answers(worker.address, TEXTS, QUERY)


def test_embed_batch_size_is_one_request_per_batch(worker, expected) -> None:
    from sie_client.integrations.llamaindex import SIEEmbedding

    model = SIEEmbedding(worker.address, MODEL, embed_batch_size=4)
    try:
        assert model.embed_batch_size == 4  # LlamaIndex's field, not a client argument
        before = requests_answered(worker, MODEL, "encode")
        vectors = model.get_text_embedding_batch(TEXTS)
        assert answered_since(worker, MODEL, "encode", before, 3) == 3  # 4 + 4 + 2
        np.testing.assert_allclose(vectors, expected.documents, atol=1e-5)
    finally:
        model.close()


def test_a_batch_larger_than_the_client_s_stream_batch_is_still_one_request(worker) -> None:
    from sie_client.integrations.llamaindex import SIEEmbedding

    texts = [f"text {n}" for n in range(600)]
    model = SIEEmbedding(worker.address, MODEL, embed_batch_size=300)  # the client would otherwise split at 256
    try:
        before = requests_answered(worker, MODEL, "encode")
        assert len(model.get_text_embedding_batch(texts)) == 600
        assert answered_since(worker, MODEL, "encode", before, 2) == 2
    finally:
        model.close()


async def test_async_batches_share_one_connection_and_one_request_per_batch(worker, expected) -> None:
    from sie_client.integrations.llamaindex import SIEEmbedding

    handoffs = ThreadHandoffs()
    asyncio.get_running_loop().set_default_executor(handoffs)
    with connection_counter(worker.address) as relay:
        model = SIEEmbedding(relay.address, MODEL, embed_batch_size=4, num_workers=3)
        try:
            before = requests_answered(worker, MODEL, "encode")
            vectors = await model.aget_text_embedding_batch(TEXTS)
            assert answered_since(worker, MODEL, "encode", before, 3) == 3
            np.testing.assert_allclose(vectors, expected.documents, atol=1e-5)
            for _ in range(5):
                np.testing.assert_allclose(await model.aget_query_embedding(QUERY), expected.query, atol=1e-5)
            queries = await asyncio.gather(*(model.aget_query_embedding(QUERY) for _ in range(20)))
            np.testing.assert_allclose(queries, [expected.query] * 20, atol=1e-5)
            np.testing.assert_allclose(await model.aget_text_embedding(TEXTS[2]), expected.documents[2], atol=1e-5)
            # and the blocking calls go over the same connection
            np.testing.assert_allclose(model.get_query_embedding(QUERY), expected.query, atol=1e-5)
        finally:
            model.close()
        assert relay.accepted == 1
    assert handoffs.submitted == 0


async def test_async_rerank_and_extraction_share_one_connection_without_threads(worker, expected) -> None:
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.schema import Document, NodeWithScore, TextNode

    from sie_client.integrations.llamaindex import SIEEntityExtractor, SIERerank

    handoffs = ThreadHandoffs()
    asyncio.get_running_loop().set_default_executor(handoffs)
    nodes = [NodeWithScore(node=TextNode(text=text, id_=f"n{n}"), score=0.0) for n, text in enumerate(TEXTS)]
    with connection_counter(worker.address) as relay:
        rerank = SIERerank(relay.address, RERANKER, top_n=3)
        extractor = SIEEntityExtractor(relay.address, EXTRACTOR, show_progress=False)
        try:
            for _ in range(3):
                kept = await rerank.apostprocess_nodes(nodes, query_str=QUERY)
                assert [(n.node.node_id, n.score) for n in kept] == [
                    (f"n{i}", pytest.approx(score, abs=1e-6)) for i, score in expected.ranking[:3]
                ]
            pipeline = IngestionPipeline(transformations=[extractor])
            for _ in range(2):
                documents = [Document(text=text, id_=f"d{n}") for n, text in enumerate(TEXTS)]
                found = await pipeline.arun(documents=documents)
                assert [node.metadata["entities"] for node in found] == [
                    list(dict.fromkeys(e["text"] for e in spans)) for spans in expected.entities
                ]
        finally:
            rerank.close()
            extractor.close()
        assert relay.accepted == 1  # however many calls (the two clients' channels share it: one target)
    assert handoffs.submitted == 0


def test_blocking_extraction_runs_on_the_same_client_from_llamaindex_s_own_loops(worker, expected) -> None:
    """BaseExtractor.extract runs aextract on an event loop of its own each time: one client serves them all."""
    from llama_index.core.schema import TextNode

    from sie_client.integrations.llamaindex import SIEEntityExtractor

    with connection_counter(worker.address) as relay:
        extractor = SIEEntityExtractor(relay.address, EXTRACTOR, show_progress=False)
        try:
            for _ in range(3):
                found = extractor.extract([TextNode(text=text) for text in TEXTS])
                assert [entry["entities"] for entry in found] == [
                    list(dict.fromkeys(e["text"] for e in s)) for s in expected.entities
                ]
        finally:
            extractor.close()
        assert relay.accepted == 1


def test_base_url_and_the_model_by_keyword(worker, expected, monkeypatch) -> None:
    from sie_client.integrations.llamaindex import SIEEmbedding, SIERerank

    model = SIEEmbedding(base_url=f"http://{worker.address}", model_name=MODEL, callback_manager=None)
    try:
        np.testing.assert_allclose(model.get_query_embedding(QUERY), expected.query, atol=1e-5)
    finally:
        model.close()
    monkeypatch.setenv("SIE_BASE_URL", f"http://{worker.address}")
    rerank = SIERerank(model=RERANKER, top_n=1)  # the server from SIE_BASE_URL, as SIEClient takes it
    try:
        assert rerank.postprocess_nodes([], query_str=QUERY) == []
    finally:
        rerank.close()
    with pytest.raises(TypeError, match=r"SIEEmbedding needs the model"):
        SIEEmbedding(worker.address)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'embed_batchsize'"):
        SIEEmbedding(worker.address, MODEL, embed_batchsize=4)  # a misspelt option is the client's TypeError


def test_components_pickle_as_a_process_pool_sends_them(worker, expected) -> None:
    """IngestionPipeline(num_workers=N) sends its transformations to spawned processes by pickle: each copy connects
    a client of its own with the same arguments."""
    import pickle

    from llama_index.core.schema import TextNode

    from sie_client.integrations.llamaindex import SIEEmbedding, SIEEntityExtractor

    extractor = SIEEntityExtractor(worker.address, EXTRACTOR, show_progress=False)
    model = SIEEmbedding(worker.address, MODEL, embed_batch_size=4)
    extractor_copy, model_copy = pickle.loads(pickle.dumps([extractor, model]))
    try:
        assert model_copy.embed_batch_size == 4 and model_copy._client is not model._client
        np.testing.assert_allclose(model_copy.get_text_embedding_batch(TEXTS), expected.documents, atol=1e-5)
        found = extractor_copy.extract([TextNode(text=text) for text in TEXTS])
        assert [entry["entities"] for entry in found] == [
            list(dict.fromkeys(e["text"] for e in s)) for s in expected.entities
        ]
        np.testing.assert_allclose(
            model.get_query_embedding(QUERY), expected.query, atol=1e-5
        )  # the original still works
    finally:
        for component in (extractor, model, extractor_copy, model_copy):
            component.close()
