"""sie_client.integrations.haystack follows Haystack's conventions, checked through haystack-ai against a real worker:
`run_async` (what Pipeline.run_async calls; nothing handed to a thread, one connection), and the document
embedder's parameters as Haystack's own embedders define them: `batch_size` (requests the worker answered),
`progress_bar` (the bar on stderr), `meta_fields_to_embed` and `embedding_separator` (the vector is the engine's for
the joined text)."""

from __future__ import annotations

import asyncio
import copy
import os

import numpy as np
import pytest

from client_observation import (
    EMBEDDER,
    RERANKER,
    ThreadHandoffs,
    answered_since,
    connection_counter,
    requests_answered,
)
from sie_client import SIEClient

# Haystack would otherwise send usage telemetry on the first pipeline run (tests stay on loopback).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

MODEL = EMBEDDER
TEXTS = [f"passage {n} talks about {('cats', 'planets', 'bread')[n % 3]}" for n in range(10)]
QUERY = "which passage talks about planets?"


@pytest.fixture(scope="module")
def engine(worker):
    with SIEClient(worker.address) as client:
        yield client


def documents():
    from haystack import Document

    return [Document(id=str(n), content=text, meta={"n": n}) for n, text in enumerate(TEXTS)]


def test_batch_size_is_documents_per_request_and_progress_bar_draws(worker, engine, capsys) -> None:
    from sie_client.integrations.haystack import SIEDocumentEmbedder

    embedder = SIEDocumentEmbedder(worker.address, MODEL, batch_size=4)
    quiet = SIEDocumentEmbedder(worker.address, MODEL, batch_size=4, progress_bar=False)
    try:
        before = requests_answered(worker, MODEL, "encode")
        embedded = embedder.run(documents())["documents"]
        assert answered_since(worker, MODEL, "encode", before, 3) == 3  # 4 + 4 + 2
        np.testing.assert_allclose(
            [d.embedding for d in embedded], [r["dense"] for r in engine.encode(MODEL, TEXTS)], atol=1e-5
        )
        assert [d.id for d in embedded] == [str(n) for n in range(10)]
        assert "10/10" in capsys.readouterr().err  # on by default, as in Haystack's embedders
        quiet.run(documents())
        assert capsys.readouterr().err == ""
    finally:
        embedder.close()
        quiet.close()


def test_meta_fields_to_embed_and_embedding_separator(worker, engine) -> None:
    from haystack import Document

    from sie_client.integrations.haystack import SIEDocumentEmbedder

    embedder = SIEDocumentEmbedder(
        worker.address,
        MODEL,
        meta_fields_to_embed=["title", "missing", "empty"],
        embedding_separator=" | ",
        progress_bar=False,
    )
    try:
        given = [
            Document(content="the body", meta={"title": "A title", "empty": None}),
            Document(content=None, meta={"title": 7}),
            Document(content="no meta"),
        ]
        vectors = [d.embedding for d in embedder.run(given)["documents"]]
        sent = ["A title | the body", "7 | ", "no meta"]  # as Haystack's own embedders join them
        np.testing.assert_allclose(vectors, [r["dense"] for r in engine.encode(MODEL, sent)], atol=1e-5)
        # and the parameters survive Haystack's serialisation
        saved = embedder.to_dict()
        assert saved["init_parameters"] | {"api_key": None} == {
            "base_url": worker.address, "model": MODEL, "dims": None, "batch_size": 32, "progress_bar": False,
            "meta_fields_to_embed": ["title", "missing", "empty"], "embedding_separator": " | ", "api_key": None,
        }  # fmt: skip
        assert SIEDocumentEmbedder.from_dict(copy.deepcopy(saved)).to_dict() == saved  # from_dict changes its input
    finally:
        embedder.close()
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        SIEDocumentEmbedder(worker.address, MODEL, batch_size=0)


async def test_pipelines_run_async_without_threads_over_one_connection(worker, engine) -> None:
    from haystack import Pipeline

    from sie_client.integrations.haystack import SIEDocumentEmbedder, SIERanker, SIETextEmbedder

    handoffs = ThreadHandoffs()
    asyncio.get_running_loop().set_default_executor(handoffs)
    expected_documents = [r["dense"] for r in engine.encode(MODEL, TEXTS)]
    expected_query = engine.encode(MODEL, QUERY, is_query=True)["dense"]
    ranking = [(s["index"], s["score"]) for s in engine.score(RERANKER, QUERY, TEXTS, top_k=3)["scores"]]
    with connection_counter(worker.address) as relay:
        indexing, querying, ranking_pipeline = Pipeline(), Pipeline(), Pipeline()
        indexing.add_component("embedder", SIEDocumentEmbedder(relay.address, MODEL, batch_size=4, progress_bar=False))
        querying.add_component("embedder", SIETextEmbedder(relay.address, MODEL))
        ranking_pipeline.add_component("ranker", SIERanker(relay.address, RERANKER, top_k=3))
        try:
            for _ in range(3):
                before = requests_answered(worker, MODEL, "encode")
                indexed = await indexing.run_async({"embedder": {"documents": documents()}})
                assert answered_since(worker, MODEL, "encode", before, 3) == 3
                np.testing.assert_allclose(
                    [d.embedding for d in indexed["embedder"]["documents"]], expected_documents, atol=1e-5
                )
                queried = await querying.run_async({"embedder": {"text": QUERY}})
                np.testing.assert_allclose(queried["embedder"]["embedding"], expected_query, atol=1e-5)
                ranked = (await ranking_pipeline.run_async({"ranker": {"query": QUERY, "documents": documents()}}))[
                    "ranker"
                ]["documents"]
                assert [(d.id, d.score) for d in ranked] == [(str(i), pytest.approx(s, abs=1e-6)) for i, s in ranking]
            # run_async directly, as AsyncPipeline and agents call it, equals run
            embedder = querying.get_component("embedder")
            assert (await embedder.run_async(QUERY))["embedding"] == embedder.run(QUERY)["embedding"]
            ranker = ranking_pipeline.get_component("ranker")
            assert (await ranker.run_async(QUERY, [], top_k=1)) == {"documents": []}
        finally:
            for pipeline in (indexing, querying, ranking_pipeline):
                for name in pipeline.to_dict()["components"]:
                    await pipeline.get_component(name).close_async()
        assert relay.accepted == 1
    assert handoffs.submitted == 0


def test_ranker_scores_the_text_with_its_meta_fields(worker, engine) -> None:
    from haystack import Document

    from sie_client.integrations.haystack import SIERanker

    ranker = SIERanker(worker.address, RERANKER, meta_fields_to_embed=["title"], embedding_separator=": ")
    try:
        given = [Document(id=str(n), content=text, meta={"title": f"title {n}"}) for n, text in enumerate(TEXTS[:4])]
        ranked = ranker.run(QUERY, given)["documents"]
        sent = [f"title {n}: {text}" for n, text in enumerate(TEXTS[:4])]
        expected = engine.score(RERANKER, QUERY, sent)["scores"]
        assert [(d.id, d.score) for d in ranked] == [
            (str(s["index"]), pytest.approx(s["score"], abs=1e-6)) for s in expected
        ]
    finally:
        ranker.close()
