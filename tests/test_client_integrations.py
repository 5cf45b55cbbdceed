"""The framework integrations (sie_client.integrations) through each framework's own interfaces, against the real libraries."""

from __future__ import annotations

import os

import numpy as np
import pytest

from sie_client import SIEClient

# Haystack would otherwise send usage telemetry on the first pipeline run (tests stay on loopback).
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

MODEL = "test/tiny-mean"
TEXTS = ["the cat sat on the mat", "vector search finds neighbours", "a third document"]


@pytest.fixture
def reference(worker):
    with SIEClient(worker.address) as client:
        documents = np.stack([r["dense"] for r in client.encode(MODEL, TEXTS)])
        query = client.encode(MODEL, "where did the cat sit?", is_query=True)["dense"]
    return documents, query


def test_langchain_embeddings(worker, reference) -> None:
    from langchain_core.embeddings import Embeddings
    from langchain_core.vectorstores import InMemoryVectorStore

    from sie_client.integrations.langchain import SIEEmbeddings

    embeddings = SIEEmbeddings(worker.address, MODEL)
    try:
        assert isinstance(embeddings, Embeddings)
        np.testing.assert_allclose(embeddings.embed_documents(TEXTS), reference[0], atol=1e-5)
        np.testing.assert_allclose(embeddings.embed_query("where did the cat sit?"), reference[1], atol=1e-5)
        store = InMemoryVectorStore.from_texts(TEXTS, embeddings)  # the framework drives our class
        hits = store.similarity_search("where did the cat sit?", k=3)
        assert sorted(hit.page_content for hit in hits) == sorted(TEXTS)
    finally:
        embeddings.close()


async def test_langchain_async_embeddings(worker, reference) -> None:
    from sie_client.integrations.langchain import SIEEmbeddings

    embeddings = SIEEmbeddings(worker.address, MODEL)
    try:
        np.testing.assert_allclose(await embeddings.aembed_documents(TEXTS), reference[0], atol=1e-5)
        np.testing.assert_allclose(await embeddings.aembed_query("where did the cat sit?"), reference[1], atol=1e-5)
    finally:
        embeddings.close()


def test_llamaindex_embedding(worker, reference) -> None:
    from llama_index.core.base.embeddings.base import BaseEmbedding

    from sie_client.integrations.llamaindex import SIEEmbedding

    model = SIEEmbedding(worker.address, MODEL)
    try:
        assert isinstance(model, BaseEmbedding)
        np.testing.assert_allclose(model.get_text_embedding_batch(TEXTS), reference[0], atol=1e-5)
        np.testing.assert_allclose(model.get_query_embedding("where did the cat sit?"), reference[1], atol=1e-5)
        np.testing.assert_allclose(model.get_text_embedding(TEXTS[0]), reference[0][0], atol=1e-5)
    finally:
        model.close()


async def test_llamaindex_async_embedding(worker, reference) -> None:
    from sie_client.integrations.llamaindex import SIEEmbedding

    model = SIEEmbedding(worker.address, MODEL)
    try:
        np.testing.assert_allclose(await model.aget_query_embedding("where did the cat sit?"), reference[1], atol=1e-5)
        np.testing.assert_allclose(await model.aget_text_embedding(TEXTS[1]), reference[0][1], atol=1e-5)
    finally:
        model.close()


# --- rerankers, extractors and vector stores -------------------------------------------------------
# Round trips use the real demo model, so the nearest document is a meaningful answer; the query
# paths are checked on test/tiny-mean, whose query prompt makes a query vector differ from a document's.

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
SPARSE_MODEL = "test/tiny-splade"
RERANKER = "test/tiny-reranker"
EXTRACTOR = "test/tiny-ner"
CORPUS = [
    "The cat slept on the warm windowsill all afternoon.",
    "Quarterly revenue grew by twelve percent compared with last year.",
    "Knead the dough with flour, eggs and butter before baking.",
    "Jupiter is the largest planet in the solar system.",
]
QUESTIONS = {"Where did the cat take a nap?": 0, "Which planet is the biggest?": 3}
RERANK_QUERY = "how do plants make energy"
PASSAGES = [
    "photosynthesis turns light into chemical energy",
    "the stock market closed higher today",
    "plants need water and sunlight to grow",
    "a short one",
    "energy drinks contain caffeine",
]
ENTITY_TEXTS = ["Angela Merkel met Emmanuel Macron in Paris on Tuesday.", "Nothing much here", "Zürich und São Paulo — naïve café"]
QUESTION = "where did the cat sit?"


@pytest.fixture(scope="module")
def engine(worker):
    with SIEClient(worker.address) as client:
        yield client


@pytest.fixture(scope="module")
def query_vectors(engine):
    """test/tiny-mean's query and document vectors of QUESTION, which differ (its query prompt)."""
    query = engine.encode(MODEL, QUESTION, is_query=True)["dense"]
    document = engine.encode(MODEL, QUESTION)["dense"]
    assert not np.allclose(query, document, atol=1e-3)
    return query, document


@pytest.fixture(scope="module")
def reranked(engine) -> list[tuple[int, float]]:
    """The reranker's (index, score) pairs for PASSAGES, best first; not the input order, so a pass-through fails."""
    ranking = [(entry["index"], entry["score"]) for entry in engine.score(RERANKER, RERANK_QUERY, PASSAGES)["scores"]]
    assert [index for index, _ in ranking] != list(range(len(PASSAGES)))
    return ranking


@pytest.fixture(scope="module")
def extracted(engine) -> list[list[dict]]:
    found = [[dict(entity) for entity in result["entities"]] for result in engine.extract(EXTRACTOR, ENTITY_TEXTS)]
    assert sum(map(len, found)) > 0, "the texts should produce some entities"
    return found


def test_langchain_reranker_orders_documents_by_score(worker, reranked) -> None:
    from langchain_core.documents import BaseDocumentCompressor, Document

    from sie_client.integrations.langchain import SIEReranker

    documents = [Document(page_content=text, metadata={"n": n}) for n, text in enumerate(PASSAGES)]
    reranker = SIEReranker(worker.address, RERANKER, top_n=3)
    try:
        assert isinstance(reranker, BaseDocumentCompressor)
        kept = reranker.compress_documents(documents, RERANK_QUERY)
        assert [(d.page_content, d.metadata["n"]) for d in kept] == [(PASSAGES[i], i) for i, _ in reranked[:3]]
        assert [d.metadata["relevance_score"] for d in kept] == pytest.approx([score for _, score in reranked[:3]], abs=1e-6)
        assert reranker.compress_documents([], RERANK_QUERY) == []
    finally:
        reranker.close()


def test_langchain_entity_extractor_adds_entities_to_metadata(worker, extracted) -> None:
    from langchain_core.documents import BaseDocumentTransformer, Document

    from sie_client.integrations.langchain import SIEEntityExtractor

    extractor = SIEEntityExtractor(worker.address, EXTRACTOR)
    try:
        assert isinstance(extractor, BaseDocumentTransformer)
        documents = extractor.transform_documents([Document(page_content=text, metadata={"source": "s"}) for text in ENTITY_TEXTS])
        assert [d.metadata["entities"] for d in documents] == extracted
        assert all(d.metadata["source"] == "s" for d in documents)
        for document in documents:
            for entity in document.metadata["entities"]:
                assert document.page_content[entity["start"] : entity["end"]] == entity["text"]
    finally:
        extractor.close()


def test_llamaindex_rerank_postprocesses_nodes(worker, reranked) -> None:
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
    from llama_index.core.schema import NodeWithScore, TextNode

    from sie_client.integrations.llamaindex import SIERerank

    nodes = [NodeWithScore(node=TextNode(text=text, id_=f"n{n}"), score=0.0) for n, text in enumerate(PASSAGES)]
    rerank = SIERerank(worker.address, RERANKER, top_n=3)
    try:
        assert isinstance(rerank, BaseNodePostprocessor)
        kept = rerank.postprocess_nodes(nodes, query_str=RERANK_QUERY)
        assert [node.node.node_id for node in kept] == [f"n{i}" for i, _ in reranked[:3]]
        assert [node.score for node in kept] == pytest.approx([score for _, score in reranked[:3]], abs=1e-6)
        with pytest.raises(ValueError, match="needs the query"):
            rerank.postprocess_nodes(nodes)
    finally:
        rerank.close()


def test_llamaindex_entity_extractor_in_an_ingestion_pipeline(worker, extracted) -> None:
    from llama_index.core.ingestion import IngestionPipeline
    from llama_index.core.schema import Document

    from sie_client.integrations.llamaindex import SIEEntityExtractor

    pipeline = IngestionPipeline(transformations=[SIEEntityExtractor(worker.address, EXTRACTOR)])
    nodes = pipeline.run(documents=[Document(text=text, id_=f"d{n}") for n, text in enumerate(ENTITY_TEXTS)])
    expected = [list(dict.fromkeys(entity["text"] for entity in spans)) for spans in extracted]
    assert [node.metadata["entities"] for node in nodes] == expected


def test_haystack_embedders_in_pipelines_find_the_nearest_document(worker, engine, query_vectors) -> None:
    from haystack import Document, Pipeline
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from sie_client.integrations.haystack import SIEDocumentEmbedder, SIETextEmbedder

    store = InMemoryDocumentStore(embedding_similarity_function="cosine")
    indexing = Pipeline()
    indexing.add_component("embedder", SIEDocumentEmbedder(worker.address, MINILM))
    indexing.add_component("writer", DocumentWriter(store))
    indexing.connect("embedder.documents", "writer.documents")
    indexing.run({"embedder": {"documents": [Document(id=str(n), content=text) for n, text in enumerate(CORPUS)]}})
    stored = {document.id: document.embedding for document in store.filter_documents()}
    np.testing.assert_allclose([stored[str(n)] for n in range(len(CORPUS))], [r["dense"] for r in engine.encode(MINILM, CORPUS)], atol=1e-5)

    querying = Pipeline()
    querying.add_component("embedder", SIETextEmbedder(worker.address, MINILM))
    querying.add_component("retriever", InMemoryEmbeddingRetriever(store, top_k=1))
    querying.connect("embedder.embedding", "retriever.query_embedding")
    for question, nearest in QUESTIONS.items():
        assert [d.id for d in querying.run({"embedder": {"text": question}})["retriever"]["documents"]] == [str(nearest)]

    # the round trip through Haystack's serialisation keeps the settings
    saved = querying.get_component("embedder").to_dict()
    assert saved["init_parameters"]["api_key"] == {"type": "env_var", "env_vars": ["SIE_API_KEY"], "strict": False}
    loaded = Pipeline.loads(querying.dumps(), allowed_modules=["sie_client.integrations.haystack"])
    assert loaded.get_component("embedder").to_dict() == saved
    for pipeline in (indexing, querying):
        pipeline.get_component("embedder").close()

    query_embedder = SIETextEmbedder(worker.address, MODEL)
    document_embedder = SIEDocumentEmbedder(worker.address, MODEL)
    try:
        np.testing.assert_allclose(query_embedder.run(QUESTION)["embedding"], query_vectors[0], atol=1e-5)
        np.testing.assert_allclose(document_embedder.run([Document(content=QUESTION)])["documents"][0].embedding, query_vectors[1], atol=1e-5)
    finally:
        query_embedder.close()
        document_embedder.close()


def test_haystack_ranker_orders_documents_by_score(worker, reranked) -> None:
    from haystack import Document

    from sie_client.integrations.haystack import SIERanker

    ranker = SIERanker(worker.address, RERANKER)
    try:
        ranked = ranker.run(RERANK_QUERY, [Document(id=str(n), content=text) for n, text in enumerate(PASSAGES)], top_k=3)["documents"]
        assert [d.id for d in ranked] == [str(i) for i, _ in reranked[:3]]
        assert [d.score for d in ranked] == pytest.approx([score for _, score in reranked[:3]], abs=1e-6)
        assert ranker.run(RERANK_QUERY, [])["documents"] == []
    finally:
        ranker.close()


def test_chroma_embedding_function_round_trip(worker, query_vectors) -> None:
    import chromadb
    from chromadb.config import Settings

    from sie_client.integrations.chroma import SIEEmbeddingFunction

    chroma = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    function = SIEEmbeddingFunction(worker.address, MINILM)
    tiny = SIEEmbeddingFunction(worker.address, MODEL)
    try:
        collection = chroma.create_collection("sie-round-trip", embedding_function=function)
        collection.add(ids=[str(n) for n in range(len(CORPUS))], documents=CORPUS)
        for question, nearest in QUESTIONS.items():
            assert collection.query(query_texts=[question], n_results=1)["ids"] == [[str(nearest)]]
        assert collection.configuration["embedding_function"].get_config() == {"target": worker.address, "model": MINILM, "dims": None}

        # Chroma itself picks embed_query for query_texts: the distance is the query vector's.
        queries = chroma.create_collection("sie-query-path", embedding_function=tiny)
        queries.add(ids=["q"], documents=[QUESTION])
        distance = queries.query(query_texts=[QUESTION], n_results=1, include=["distances"])["distances"][0][0]
        assert distance == pytest.approx(1 - float(query_vectors[0] @ query_vectors[1]), abs=1e-4)
        assert distance > 1e-3
    finally:
        function.close()
        tiny.close()


def test_qdrant_dense_sparse_and_hybrid_round_trip(worker, engine) -> None:
    from qdrant_client import QdrantClient, models
    from qdrant_client.hybrid.fusion import reciprocal_rank_fusion

    from sie_client.integrations.qdrant import SIEQdrantVectors

    vectors = SIEQdrantVectors(worker.address, dense_model=MINILM, sparse_model=SPARSE_MODEL)
    qdrant = QdrantClient(":memory:")
    try:
        config = vectors.collection_config()
        assert config["vectors_config"]["dense"].size == 384
        qdrant.create_collection("docs", **config)
        qdrant.upsert("docs", vectors.points(CORPUS, payloads=[{"text": text} for text in CORPUS]))

        # the stored sparse vector is the engine's, index for index
        sparse_documents = [r["sparse"] for r in engine.encode(SPARSE_MODEL, CORPUS, output_types=["sparse"])]
        stored = qdrant.retrieve("docs", [0], with_vectors=True)[0].vector["sparse"]
        assert stored.indices == sparse_documents[0]["indices"].tolist()
        assert stored.values == pytest.approx(sparse_documents[0]["values"].tolist(), abs=1e-6)

        for question, nearest in QUESTIONS.items():
            query = vectors.query_vectors(question)
            dense_hits = qdrant.query_points("docs", query=query["dense"], using="dense", limit=len(CORPUS)).points
            assert dense_hits[0].id == nearest and dense_hits[0].payload == {"text": CORPUS[nearest]}

            # sparse: Qdrant's ranking and scores are the dot products of the engine's sparse vectors
            engine_query = engine.encode(SPARSE_MODEL, question, is_query=True, output_types=["sparse"])["sparse"]
            weights = dict(zip(engine_query["indices"].tolist(), engine_query["values"].tolist()))
            expected = [sum(weights.get(i, 0.0) * v for i, v in zip(d["indices"].tolist(), d["values"].tolist())) for d in sparse_documents]
            sparse_hits = qdrant.query_points("docs", query=query["sparse"], using="sparse", limit=len(CORPUS)).points
            assert [hit.id for hit in sparse_hits] == list(np.argsort(expected)[::-1])
            assert [hit.score for hit in sparse_hits] == pytest.approx(sorted(expected, reverse=True), rel=1e-4)

            # hybrid: Qdrant's own reciprocal-rank fusion of the two rankings above
            fused = qdrant.query_points("docs", **vectors.hybrid_query(question, limit=len(CORPUS))).points
            want = reciprocal_rank_fusion([dense_hits, sparse_hits], limit=len(CORPUS))
            assert {hit.id: hit.score for hit in fused} == pytest.approx({hit.id: hit.score for hit in want})
            dbsf = qdrant.query_points("docs", **vectors.hybrid_query(question, limit=2, fusion=models.Fusion.DBSF)).points
            assert len(dbsf) == 2
    finally:
        vectors.close()
        qdrant.close()


def test_qdrant_query_vectors_are_query_embeddings(worker, query_vectors) -> None:
    from sie_client.integrations.qdrant import SIEQdrantVectors

    vectors = SIEQdrantVectors(worker.address, dense_model=MODEL, sparse_model=SPARSE_MODEL)
    try:
        np.testing.assert_allclose(vectors.query_vectors(QUESTION)["dense"], query_vectors[0], atol=1e-5)
        np.testing.assert_allclose(vectors.points([QUESTION])[0].vector["dense"], query_vectors[1], atol=1e-5)
    finally:
        vectors.close()


def test_lancedb_registered_embedding_function_round_trip(worker, tmp_path, query_vectors) -> None:
    import lancedb
    from lancedb.embeddings import get_registry
    from lancedb.pydantic import LanceModel, Vector

    import sie_client.integrations.lancedb  # noqa: F401  (registers "sie")

    function = get_registry().get("sie").create(target=worker.address, model=MINILM)
    assert function.ndims() == 384

    class Passage(LanceModel):
        text: str = function.SourceField()
        vector: Vector(384) = function.VectorField()  # type: ignore[valid-type]

    db = lancedb.connect(tmp_path / "lance")
    table = db.create_table("passages", schema=Passage)
    table.add([{"text": text} for text in CORPUS])
    for question, nearest in QUESTIONS.items():
        assert [hit.text for hit in table.search(question).limit(1).to_pydantic(Passage)] == [CORPUS[nearest]]
    # a reopened table rebuilds the function from the registry and the stored config
    reopened = lancedb.connect(tmp_path / "lance").open_table("passages")
    assert reopened.search(next(iter(QUESTIONS))).limit(1).to_list()[0]["text"] == CORPUS[0]

    tiny = get_registry().get("sie").create(target=worker.address, model=MODEL)
    np.testing.assert_allclose(tiny.compute_query_embeddings(QUESTION)[0], query_vectors[0], atol=1e-5)
    np.testing.assert_allclose(tiny.compute_source_embeddings([QUESTION])[0], query_vectors[1], atol=1e-5)

    # LanceDB itself embeds a search string as a query: the distance is the query vector's (squared L2).
    class TinyPassage(LanceModel):
        text: str = tiny.SourceField()
        vector: Vector(32) = tiny.VectorField()  # type: ignore[valid-type]

    queries = db.create_table("query-path", schema=TinyPassage)
    queries.add([{"text": QUESTION}])
    distance = queries.search(QUESTION).limit(1).to_list()[0]["_distance"]
    assert distance == pytest.approx(float(np.sum((query_vectors[0] - query_vectors[1]) ** 2)), abs=1e-4)
    assert distance > 1e-3
    tiny.close()
    function.close()
