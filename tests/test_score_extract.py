"""Score (cross-encoder and late interaction) and Extract (NER spans, GLiNER), against references computed here."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer, pipeline

from conftest import MISCONFIGURED_MODEL
from grpc_helpers import call_until_loaded, error_details, items
from sie.v1 import inference_pb2, types_pb2
from sie_contract.tensors import from_tensor

QUERY = "how do plants make energy"
DOCUMENTS = [
    "photosynthesis turns light into chemical energy",
    "the stock market closed higher today",
    "plants need water and sunlight to grow",
    "a short one",
    "energy drinks contain caffeine",
]


def score(stub, model: str, **fields) -> inference_pb2.ScoreResponse:
    return stub.Score(
        inference_pb2.ScoreRequest(model=model, query=types_pb2.Item(text=QUERY), items=items(DOCUMENTS), **fields), timeout=60
    )


def test_cross_encoder_scores_equal_transformers_sorted_with_ranks(stub, tiny_models) -> None:
    directory = tiny_models["test/tiny-reranker"]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    with torch.inference_mode():
        batch = tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
        # One label: sentence-transformers' CrossEncoder applies a sigmoid.
        expected = torch.sigmoid(model(**batch).logits[:, 0]).numpy()

    response = score(stub, "test/tiny-reranker")
    assert response.tokens == sum(len(tokenizer(QUERY, document)["input_ids"]) for document in DOCUMENTS)
    assert response.images == 0
    assert [entry.rank for entry in response.scores] == list(range(len(DOCUMENTS)))
    assert [entry.index for entry in response.scores] == list(np.argsort(-expected))
    for entry in response.scores:
        assert entry.item_id == f"item-{entry.index}"
        assert entry.score == pytest.approx(expected[entry.index], abs=1e-5)

    top = score(stub, "test/tiny-reranker", top_k=2)
    assert [entry.index for entry in top.scores] == [entry.index for entry in response.scores[:2]]


def test_late_interaction_score_is_maxsim_of_served_multivectors(stub) -> None:
    def vectors(texts: list[str], is_query: bool) -> list[np.ndarray]:
        request = inference_pb2.EncodeRequest(model="test/tiny-colbert", items=items(texts), output_types=["multivector"], is_query=is_query)
        return [from_tensor(result.multivector) for result in stub.Encode(request, timeout=60).results]

    query = vectors([QUERY], True)[0]
    expected = np.array([(query @ document.T).max(axis=1).sum() for document in vectors(DOCUMENTS, False)])
    response = score(stub, "test/tiny-colbert", top_k=3)
    assert [entry.index for entry in response.scores] == list(np.argsort(-expected)[:3])
    for entry in response.scores:
        assert entry.score == pytest.approx(expected[entry.index], rel=1e-5)


TEXTS = ["Angela Merkel met Emmanuel Macron in Paris on Tuesday.", "Nothing much here", "Zürich und São Paulo — naïve café"]


def test_token_classification_spans_equal_the_transformers_pipeline(stub, tiny_models) -> None:
    directory = tiny_models["test/tiny-ner"]
    reference = pipeline(
        "token-classification",
        model=AutoModelForTokenClassification.from_pretrained(directory),
        tokenizer=AutoTokenizer.from_pretrained(directory),
        aggregation_strategy="simple",
        device="cpu",
    )
    response = stub.Extract(inference_pb2.ExtractRequest(model="test/tiny-ner", items=items(TEXTS)), timeout=60)
    found = 0
    for text, result in zip(TEXTS, response.results):
        expected = [(e["entity_group"], e["start"], e["end"], e["score"]) for e in reference(text)]
        served = [(e.label, e.start, e.end, e.score) for e in result.entities]
        assert [entity[:3] for entity in served] == [entity[:3] for entity in expected]
        for (_, _, _, got), (_, _, _, want) in zip(served, expected):
            assert got == pytest.approx(want, abs=1e-5)
        for entity in result.entities:
            assert entity.text == text[entity.start : entity.end]
        found += len(served)
    assert found > 0, "the test texts should produce some entities"

    # threshold drops entities scored below it
    scores = sorted(e.score for result in response.results for e in result.entities)
    cut = scores[len(scores) // 2]
    kept = stub.Extract(inference_pb2.ExtractRequest(model="test/tiny-ner", items=items(TEXTS), threshold=cut), timeout=60)
    assert all(e.score >= cut for result in kept.results for e in result.entities)
    assert sum(len(result.entities) for result in kept.results) == sum(score >= cut for score in scores)


def test_config_asking_an_adapter_for_a_task_it_lacks_fails_to_load(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: score(stub, MISCONFIGURED_MODEL))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "adapter splade does not do score; it does: encode" in raised.value.details()
    assert error_details(raised.value)[0].reason == "MODEL_LOAD_FAILED"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda stub: score(stub, "test/tiny-mean"), "does not support score; it supports: encode"),
        (lambda stub: stub.Extract(inference_pb2.ExtractRequest(model="test/tiny-reranker", items=items(TEXTS)), timeout=60), "it supports: score"),
        (
            lambda stub: stub.Encode(inference_pb2.EncodeRequest(model="test/tiny-ner", items=items(TEXTS)), timeout=60),
            "does not support encode; it supports: extract",
        ),
    ],
    ids=["score on an embedder", "extract on a reranker", "encode on an extractor"],
)
def test_operation_the_model_lacks_is_invalid_argument_naming_what_it_supports(stub, call, message) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        call(stub)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in raised.value.details()
    assert error_details(raised.value)[0].reason == "OPERATION_NOT_SUPPORTED"


def test_models_list_their_capabilities(stub) -> None:
    models = {model.id: model for model in stub.ListModels(inference_pb2.ListModelsRequest()).models}
    assert list(models["test/tiny-colbert"].tasks) == ["encode", "score"]
    assert list(models["test/tiny-colbert"].output_types) == ["multivector", "dense"]
    assert models["test/tiny-colbert"].dims == 20 * 2**3 * 8
    assert list(models["test/tiny-splade"].output_types) == ["sparse"]
    assert list(models["test/tiny-ner"].tasks) == ["extract"]
    assert list(models["test/tiny-mean-lora"].loras) == ["alpha", "beta", "gamma"]


async def test_the_work_stream_serves_score_and_extract(worker, stub) -> None:
    from sie_gateway.worker_link import WorkerLink

    score_request = inference_pb2.ScoreRequest(model="test/tiny-reranker", query=types_pb2.Item(text=QUERY), items=items(DOCUMENTS))
    extract_request = inference_pb2.ExtractRequest(model="test/tiny-ner", items=items(TEXTS))
    link = WorkerLink("w", worker.address, window=4)
    try:
        scored = await link.call("score", score_request, timeout_s=60)
        extracted = await link.call("extract", extract_request, timeout_s=60)
    finally:
        await link.close()
    assert [(e.index, e.score) for e in scored.score.scores] == [(e.index, e.score) for e in stub.Score(score_request, timeout=60).scores]
    assert list(extracted.extract.results) == list(stub.Extract(extract_request, timeout=60).results)
