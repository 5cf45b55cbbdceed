"""Zero-shot classification through a real worker against the reference libraries in-process, on tiny random
replicas built offline: the NLI adapter against transformers' zero-shot-classification pipeline (BERT and BART
replicas with an MNLI label map), the GLiClass adapter against gliclass's own ZeroShotClassificationPipeline.
Same labels in the same order, scores within 1e-4. Also the bounds of their options."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from gliclass import GLiClassModel, ZeroShotClassificationPipeline
from google.protobuf import struct_pb2
from transformers import (
    AutoTokenizer,
    pipeline,
)

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_families import NLI_LABELS as LABELS
from tiny_families import NLI_MAX_LENGTH as MAX_LENGTH
from tiny_families import NLI_TEMPLATE as TEMPLATE
from tiny_families import NLI_TEXTS as TEXTS
from tiny_families import build_tiny_bart_nli, build_tiny_gliclass, build_tiny_nli
from tiny_models import write_config
from worker_process import Services, WorkerProcess, inference_stub

NLI = "test/nli-bert"
NLI_BART = "test/nli-bart"
NO_ENTAILMENT = "test/nli-no-entailment"
# Two classes, entailment first (as MoritzLaurer's zeroshot-v2.0 models): "not_entailment" is the contradiction.
NLI_TWO = "test/nli-two-class"
GLICLASS = "test/gliclass-uni"
GLICLASS_REMOTE_CODE = "test/gliclass-remote-code"
NLI_PROFILES = (
    "profiles:\n  default:\n    adapter: nli_zero_shot\n"
    f"  topic:\n    extends: default\n    run_options: {{hypothesis_template: '{TEMPLATE}'}}\n"
)
GLICLASS_PROFILES = (
    "profiles:\n  default:\n    adapter: gliclass\n"
    "  single:\n    extends: default\n    run_options: {classification_type: single-label}\n"
    "  strict:\n    extends: default\n    run_options: {threshold: 0.8}\n"
)


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("zero-shot")
    gliclass = build_tiny_gliclass(root / "gliclass")
    remote = build_tiny_gliclass(root / "gliclass-remote-code")
    config = json.loads((remote / "config.json").read_text())
    config["encoder_config"]["auto_map"] = {"AutoModel": "modeling_backbone.Backbone"}
    (remote / "config.json").write_text(json.dumps(config))
    return {
        NLI: build_tiny_nli(root / "nli"),
        NLI_BART: build_tiny_bart_nli(root / "nli-bart"),
        NO_ENTAILMENT: build_tiny_nli(root / "no-entailment", label2id={"LABEL_0": 0, "LABEL_1": 1, "LABEL_2": 2}),
        NLI_TWO: build_tiny_nli(root / "two-class", label2id={"entailment": 0, "not_entailment": 1}),
        GLICLASS: gliclass,
        GLICLASS_REMOTE_CODE: remote,
    }


def _start(directories: dict[str, Path], root: Path, **env: str) -> WorkerProcess:
    configs = root / "configs"
    configs.mkdir()
    for model_id, directory in directories.items():
        profiles = GLICLASS_PROFILES if "gliclass" in model_id else NLI_PROFILES
        write_config(configs, model_id, f"path: {directory}\ntasks: [extract]\n{profiles}")
    worker = WorkerProcess({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": "", **env}, root / "worker.log")
    worker.wait_serving()
    return worker


@pytest.fixture(scope="module")
def zero_shot_stub(
    services: Services, directories: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(services.keep(_start(directories, tmp_path_factory.mktemp("zero-shot-worker")))) as stub:
        yield stub


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
@pytest.mark.parametrize("model_id", [NLI, NLI_BART])
def test_nli_equals_the_transformers_pipeline(zero_shot_stub, directories, model_id, labels, options, profile) -> None:
    classify = pipeline("zero-shot-classification", model=str(directories[model_id]), device="cpu")
    options_used = {"hypothesis_template": TEMPLATE} if profile == "topic" else dict(options or {})
    expected = [classify(text, candidate_labels=labels, **options_used) for text in TEXTS]
    _assert_same(_extract(zero_shot_stub, model_id, labels=labels, options=options, profile=profile), expected)
    # the scores spread: a wrong index or softmax would not stay within the tolerance
    assert max(max(e["scores"]) - min(e["scores"]) for e in expected) > 0.02 or len(labels) == 1


@pytest.mark.parametrize("options", [None, {"multi_label": True}])
def test_a_two_class_model_with_entailment_first_equals_the_pipeline(zero_shot_stub, directories, options) -> None:
    classify = pipeline("zero-shot-classification", model=str(directories[NLI_TWO]), device="cpu")
    expected = [classify(text, candidate_labels=LABELS, **(options or {})) for text in TEXTS]
    _assert_same(_extract(zero_shot_stub, NLI_TWO, options=options), expected)


def test_a_threshold_drops_the_lower_classes(zero_shot_stub, directories) -> None:
    classify = pipeline("zero-shot-classification", model=str(directories[NLI]), device="cpu")
    expected = [classify(text, candidate_labels=LABELS, multi_label=True) for text in TEXTS]
    response = _extract(zero_shot_stub, NLI, options={"multi_label": True}, threshold=0.5)
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
        ({"multilabel": True}, "reads no option 'multilabel'"),
        ({"hypothesis_template": "word " * 80 + "{}"}, "longer than the model's 64 tokens"),
    ],
)
def test_bad_options_are_invalid(zero_shot_stub, options, message) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(zero_shot_stub, NLI, options=options)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == ("UNKNOWN_OPTION" if "multilabel" in options else "INVALID_OPTIONS")
    assert message in raised.value.details()


def test_no_labels_is_invalid(zero_shot_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(zero_shot_stub, NLI, labels=[])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "NO_LABELS"


def test_a_model_without_an_entailment_label_fails_to_load(zero_shot_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(zero_shot_stub, NO_ENTAILMENT)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "no label starting with 'entail'" in raised.value.details()


# --- GLiClass ------------------------------------------------------------------------------------


def _gliclass_reference(directory: Path) -> ZeroShotClassificationPipeline:
    model = GLiClassModel.from_pretrained(str(directory))
    return ZeroShotClassificationPipeline(
        model, AutoTokenizer.from_pretrained(str(directory)), max_length=MAX_LENGTH, device="cpu", progress_bar=False
    )


def _best_first(predictions: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """gliclass's predictions (in label order) as the worker answers them, best first."""
    ordered = [sorted(found, key=lambda p: -p["score"]) for found in predictions]
    return [{"labels": [p["label"] for p in found], "scores": [p["score"] for p in found]} for found in ordered]


@pytest.mark.parametrize(
    ("reference_options", "options", "threshold", "profile"),
    [
        ({}, None, None, ""),  # multi-label at gliclass's default threshold, 0.5
        ({"threshold": 0.0}, None, 0.0, ""),
        ({"threshold": 0.8}, None, None, "strict"),  # the profile's threshold
        ({"classification_type": "single-label"}, {"classification_type": "single-label"}, None, ""),
        ({"classification_type": "single-label"}, None, None, "single"),
    ],
)
def test_gliclass_equals_its_pipeline(zero_shot_stub, directories, reference_options, options, threshold, profile) -> None:
    expected = _best_first(_gliclass_reference(directories[GLICLASS])(TEXTS, LABELS, **reference_options))
    _assert_same(_extract(zero_shot_stub, GLICLASS, options=options, threshold=threshold, profile=profile), expected)
    assert sum(len(e["labels"]) for e in expected) >= len(TEXTS)


def test_gliclass_scores_spread(directories) -> None:
    every = _gliclass_reference(directories[GLICLASS])(TEXTS, LABELS, threshold=0.0)
    assert max(p["score"] for found in every for p in found) - min(p["score"] for found in every for p in found) > 0.1


def test_gliclass_bad_options_are_invalid(zero_shot_stub) -> None:
    for options, message in [
        ({"classification_type": "multi"}, "must be one of single-label, multi-label"),
        ({"multi_label": True}, "reads no option 'multi_label'"),
    ]:
        with pytest.raises(grpc.RpcError) as raised:
            _extract(zero_shot_stub, GLICLASS, options=options)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error_info(raised.value).reason == ("UNKNOWN_OPTION" if "multi_label" in options else "INVALID_OPTIONS")
        assert message in raised.value.details()


def test_gliclass_refuses_shipped_code_without_trust_remote_code(zero_shot_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(zero_shot_stub, GLICLASS_REMOTE_CODE)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "encoder_config names code shipped with the weights (auto_map)" in raised.value.details()


@pytest.mark.process
def test_a_worker_without_gliclass_answers_dependency_missing(directories: dict[str, Path], tmp_path: Path) -> None:
    # A `gliclass` that cannot be imported, first on the worker's path: as if the package were not installed.
    hidden = tmp_path / "no-gliclass" / "gliclass"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'gliclass'\", name='gliclass')\n")
    path = os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH", "")]))
    worker = _start({GLICLASS: directories[GLICLASS]}, tmp_path, PYTHONPATH=path)
    try:
        with grpc.insecure_channel(worker.address) as channel, pytest.raises(grpc.RpcError) as raised:
            _extract(inference_pb2_grpc.InferenceStub(channel), GLICLASS)
    finally:
        worker.stop()
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "ADAPTER_DEPENDENCY_MISSING"
    assert "missing module 'gliclass'" in raised.value.details()
