"""The LangChain and LlamaIndex classes through their frameworks' own embedding interfaces."""

from __future__ import annotations

import numpy as np
import pytest

from sie_client import SIEClient

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
