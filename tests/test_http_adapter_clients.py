"""Other ecosystems' clients, unmodified, against a real `sie up` through the gateway's HTTP adapter: Cohere's SDK
(ClientV2 and Client with base_url) and a Jina-shaped request on rerank; huggingface_hub's InferenceClient, LangChain's
HuggingFaceEndpointEmbeddings, LlamaIndex's TextEmbeddingsInference and Haystack's TEI embedder on the TEI routes;
the official openai package's models.list(). Every score and vector equal to our own Score and Encode answers."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import numpy as np
import pytest

from adapter_stack import COLBERT, MINILM, RERANKER, SPLADE, adapter_stack
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor

# Starts processes (a `sie up` of its own) in fixtures of its own.
pytestmark = pytest.mark.process

QUERY = "how do vector databases work?"
DOCUMENTS = [
    "Paris is the capital of France.",
    "A vector database stores embeddings and finds the nearest ones.",
    "Bread rises because of yeast.",
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_models):
    with adapter_stack(tmp_path_factory.mktemp("adapter-clients"), tiny_models) as running:
        yield running


def our_scores(stack, model: str) -> dict[int, float]:
    """Score's own answer over gRPC: document index -> score."""
    with grpc.insecure_channel(stack.gateway) as channel:
        response = inference_pb2_grpc.InferenceStub(channel).Score(
            inference_pb2.ScoreRequest(
                model=model, query=types_pb2.Item(text=QUERY), items=[types_pb2.Item(text=d) for d in DOCUMENTS]
            ),
            timeout=60,
        )
    return {entry.index: entry.score for entry in response.scores}


def our_vectors(stack, model: str, texts: list[str], output: str = "dense") -> list[np.ndarray]:
    with grpc.insecure_channel(stack.gateway) as channel:
        response = inference_pb2_grpc.InferenceStub(channel).Encode(
            inference_pb2.EncodeRequest(
                model=model, items=[types_pb2.Item(text=t) for t in texts], output_types=[output]
            ),
            timeout=60,
        )
    return (
        [from_tensor(getattr(result, output)) for result in response.results]
        if output != "sparse"
        else [result.sparse for result in response.results]
    )


def normalized(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


# --- rerank ----------------------------------------------------------------------------------------------------


def test_cohere_client_v2_rerank(stack) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=stack.http)
    answer = client.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, top_n=2)
    expected = our_scores(stack, RERANKER)
    assert [result.index for result in answer.results] == sorted(expected, key=expected.get, reverse=True)[:2]
    for result in answer.results:
        assert result.relevance_score == pytest.approx(expected[result.index], abs=1e-5)
    assert answer.id


def test_cohere_client_v1_rerank_with_documents(stack) -> None:
    import cohere

    client = cohere.Client(api_key="unused", base_url=stack.http)
    answer = client.rerank(model=COLBERT, query=QUERY, documents=DOCUMENTS, return_documents=True)
    expected = our_scores(stack, COLBERT)
    assert len(answer.results) == 3
    for result in answer.results:
        assert result.relevance_score == pytest.approx(expected[result.index], abs=1e-5)
        assert result.document.text == DOCUMENTS[result.index]
    scores = [result.relevance_score for result in answer.results]
    assert scores == sorted(scores, reverse=True)


def test_jina_shaped_rerank(stack) -> None:
    body = {
        "model": RERANKER,
        "query": QUERY,
        "documents": [{"text": d} for d in DOCUMENTS],
        "top_n": 3,
        "return_documents": True,
    }
    response = httpx.post(f"{stack.http}/v1/rerank", json=body, timeout=60)
    assert response.status_code == 200, response.text
    expected = our_scores(stack, RERANKER)
    results = response.json()["results"]
    assert [r["index"] for r in results] == sorted(expected, key=expected.get, reverse=True)
    assert all(r["document"]["text"] == DOCUMENTS[r["index"]] for r in results)
    assert all(r["relevance_score"] == pytest.approx(expected[r["index"]], abs=1e-5) for r in results)


def test_cohere_errors_are_cohere_shaped(stack) -> None:
    import cohere

    client = cohere.ClientV2(api_key="unused", base_url=stack.http)
    with pytest.raises(cohere.errors.NotFoundError) as raised:
        client.rerank(model="no/such-model", query=QUERY, documents=DOCUMENTS)
    assert "no/such-model" in raised.value.body["message"]
    response = httpx.post(f"{stack.http}/v2/rerank", json={"model": RERANKER, "query": QUERY, "documents": "x"})
    assert response.status_code == 400 and response.json()["reason"] == "WRONG_TYPE", response.text


# --- TEI -------------------------------------------------------------------------------------------------------


def test_huggingface_hub_feature_extraction_on_a_tei_url(stack) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=f"{stack.http}/tei/{MINILM}")
    vectors = client.feature_extraction(DOCUMENTS[1])
    (ours,) = our_vectors(stack, MINILM, [DOCUMENTS[1]])
    np.testing.assert_allclose(np.asarray(vectors).reshape(-1), normalized(ours), atol=1e-5)


def test_langchain_huggingface_endpoint_embeddings(stack) -> None:
    from huggingface_hub import AsyncInferenceClient, InferenceClient
    from langchain_huggingface import HuggingFaceEndpointEmbeddings

    # langchain-huggingface 1.2 refuses a URL as `model` (its validator wants a Hub repo id), so it reaches a TEI
    # server, ours or Hugging Face's, only through the huggingface_hub clients it holds: given here, the rest of it
    # (embed_documents, embed_query) as it is.
    embeddings = HuggingFaceEndpointEmbeddings(model=MINILM, huggingfacehub_api_token="unused")
    embeddings.client = InferenceClient(model=f"{stack.http}/tei/{MINILM}")
    embeddings.async_client = AsyncInferenceClient(model=f"{stack.http}/tei/{MINILM}")
    documents = embeddings.embed_documents(DOCUMENTS)
    query = embeddings.embed_query(QUERY)
    for got, ours in zip(documents, our_vectors(stack, MINILM, DOCUMENTS), strict=True):
        np.testing.assert_allclose(got, normalized(ours), atol=1e-5)
    np.testing.assert_allclose(query, normalized(our_vectors(stack, MINILM, [QUERY])[0]), atol=1e-5)
    np.testing.assert_allclose(asyncio.run(embeddings.aembed_documents(DOCUMENTS)), documents, atol=1e-6)


def test_llamaindex_text_embeddings_inference(stack) -> None:
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    model = TextEmbeddingsInference(model_name=MINILM, base_url=f"{stack.http}/tei/{MINILM}", embed_batch_size=2)
    vectors = model.get_text_embedding_batch(DOCUMENTS)
    for got, ours in zip(vectors, our_vectors(stack, MINILM, DOCUMENTS), strict=True):
        np.testing.assert_allclose(got, normalized(ours), atol=1e-5)


def test_haystack_tei_embedders(stack) -> None:
    from haystack import Document
    from haystack.utils import Secret
    from haystack_integrations.components.embedders.huggingface_api import (
        HuggingFaceAPIDocumentEmbedder,
        HuggingFaceAPITextEmbedder,
    )

    tei = {"api_type": "text_embeddings_inference", "api_params": {"url": f"{stack.http}/tei/{MINILM}"}}
    text_embedder = HuggingFaceAPITextEmbedder(**tei, token=Secret.from_token("unused"))
    embedding = text_embedder.run(text=QUERY)["embedding"]
    np.testing.assert_allclose(embedding, normalized(our_vectors(stack, MINILM, [QUERY])[0]), atol=1e-5)
    document_embedder = HuggingFaceAPIDocumentEmbedder(**tei, token=Secret.from_token("unused"), batch_size=2)
    documents = document_embedder.run(documents=[Document(content=text) for text in DOCUMENTS])["documents"]
    for document, ours in zip(documents, our_vectors(stack, MINILM, DOCUMENTS), strict=True):
        np.testing.assert_allclose(document.embedding, normalized(ours), atol=1e-5)


def test_tei_routes_by_hand(stack) -> None:
    base = f"{stack.http}/tei"
    raw = httpx.post(f"{base}/{MINILM}/embed", json={"inputs": [DOCUMENTS[0]], "normalize": False}, timeout=60)
    assert raw.status_code == 200, raw.text
    np.testing.assert_allclose(raw.json()[0], our_vectors(stack, MINILM, [DOCUMENTS[0]])[0], atol=1e-5)
    sparse = httpx.post(f"{base}/{SPLADE}/embed_sparse", json={"inputs": DOCUMENTS[0]}, timeout=60).json()
    (ours,) = our_vectors(stack, SPLADE, [DOCUMENTS[0]], "sparse")
    assert [entry["index"] for entry in sparse[0]] == list(ours.indices)
    np.testing.assert_allclose([entry["value"] for entry in sparse[0]], list(ours.values), atol=1e-5)
    tokens = httpx.post(f"{base}/{COLBERT}/embed_all", json={"inputs": [DOCUMENTS[0]]}, timeout=60).json()
    np.testing.assert_allclose(tokens[0], our_vectors(stack, COLBERT, [DOCUMENTS[0]], "multivector")[0], atol=1e-5)
    ranked = httpx.post(
        f"{base}/{RERANKER}/rerank", json={"query": QUERY, "texts": DOCUMENTS, "raw_scores": True, "return_text": True}
    ).json()
    expected = our_scores(stack, RERANKER)
    assert [r["index"] for r in ranked] == sorted(expected, key=expected.get, reverse=True)
    assert all(
        r["score"] == pytest.approx(expected[r["index"]], abs=1e-5) and r["text"] == DOCUMENTS[r["index"]]
        for r in ranked
    )
    squashed = httpx.post(f"{base}/{RERANKER}", json={"query": QUERY, "texts": DOCUMENTS}).json()
    assert all(r["score"] == pytest.approx(1 / (1 + np.exp(-expected[r["index"]])), abs=1e-5) for r in squashed)
    info = httpx.get(f"{base}/{MINILM}/info").json()
    assert info["model_id"] == MINILM and info["max_input_length"] > 0 and "embedding" in info["model_type"]
    assert httpx.get(f"{base}/{MINILM}/health").status_code == 200
    for route in ("tokenize", "decode", "predict"):
        refused = httpx.post(f"{base}/{MINILM}/{route}", json={"inputs": "x"})
        assert refused.status_code == 424 and refused.json()["error_type"] == "Backend", refused.text
        assert "not exposed by this engine" in refused.json()["error"]
    missing = httpx.post(f"{base}/no/such-model/embed", json={"inputs": "x"})
    assert missing.status_code == 404 and set(missing.json()) == {"error", "error_type"}


# --- OpenAI ----------------------------------------------------------------------------------------------------


def test_openai_models_list_returns_our_models(stack) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{stack.http}/v1", api_key="unused")
    listed = {model.id: model for model in client.models.list()}
    assert set(listed) >= {MINILM, SPLADE, COLBERT, RERANKER}
    assert listed[MINILM].object == "model" and listed[MINILM].owned_by == "sentence-transformers"
    assert client.models.retrieve(MINILM).id == MINILM
    ours = httpx.get(f"{stack.http}/v1/models").json()
    assert {model["id"] for model in ours["models"]} == set(listed)  # our own listing, unchanged beside OpenAI's
    assert ours["object"] == "list" and all(model["state"].startswith("MODEL_STATE_") for model in ours["models"])
