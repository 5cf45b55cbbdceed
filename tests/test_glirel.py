"""GLiREL through a real worker against `glirel`'s own `GLiREL.predict_relations` in-process, on a tiny random
replica built offline: the same (head, tail, label) triples with scores within 1e-4, with entity spans from the
request (at two thresholds, and with top_k) and from a tiny GLiNER replica inside the model's directory. Also: bad
spans and a request without labels are refused with INVALID_ARGUMENT."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from gliner import GLiNER
from glirel import GLiREL
from google.protobuf import struct_pb2

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_families import build_tiny_glirel
from tiny_models import build_tiny_gliner, write_config
from worker_process import Services, WorkerProcess

MODEL = "test/glirel"
CONFIG = (
    "tasks: [extract]\nprofiles:\n  default:\n    adapter: glirel\n"
    "  ner:\n    extends: default\n"
    "    run_options: {entity_model: ner/model, entity_labels: [person, city, machine], entity_threshold: 0.3}\n"
)
TEXT = "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine."
# Character spans: the two people, the city and the machine.
ENTITIES = [
    (TEXT.index(name), TEXT.index(name) + len(name), label)
    for name, label in (
        ("Ada Lovelace", "person"),
        ("Charles Babbage", "person"),
        ("London", "city"),
        ("Analytical Engine", "machine"),
    )
]
LABELS = ["works with", "lives in", "invented", "born in"]
WORD = re.compile(r"\w+(?:[-_]\w+)*|\S")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GLiREL]:
    directory = tmp_path_factory.mktemp("glirel")
    model = build_tiny_glirel(directory)
    build_tiny_gliner(directory / "ner", bi_encoder=False)
    return directory, model


@pytest.fixture(scope="module")
def glirel_stub(
    services: Services, built: tuple[Path, GLiREL], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("glirel-configs")
    write_config(configs, MODEL, f"path: {built[0]}\n{CONFIG}")
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ""}, name="glirel-worker")
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def _extract(
    stub: inference_pb2_grpc.InferenceStub,
    options: dict[str, Any],
    *,
    labels: list[str] = LABELS,
    threshold: float | None = None,
    profile: str = "",
    text: str = TEXT,
) -> inference_pb2.ExtractResult:
    struct = struct_pb2.Struct()
    struct.update(options)
    request = inference_pb2.ExtractRequest(
        model=MODEL, items=[types_pb2.Item(id="0", text=text)], labels=labels, options=struct, profile=profile
    )
    if threshold is not None:
        request.threshold = threshold
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=60))
    return response.results[0]


def _reference(
    model: GLiREL, entities: list[tuple[int, int, str]], threshold: float, top_k: int = -1, text: str = TEXT
) -> dict[tuple, float]:
    """glirel's own relations between `entities` (character spans) as {(head span, tail span, label): score}."""
    words = [match.span() for match in WORD.finditer(text)]
    ner, by_words = [], {}
    for start, end, label in entities:
        covered = [index for index, (word_start, word_end) in enumerate(words) if word_start < end and word_end > start]
        ner.append([covered[0], covered[-1], label])
        by_words[(covered[0], covered[-1] + 1)] = (start, end)
    tokens = [text[start:end] for start, end in words]
    relations = model.predict_relations(tokens, LABELS, threshold=threshold, ner=ner, top_k=top_k)
    return {(by_words[tuple(r["head_pos"])], by_words[tuple(r["tail_pos"])], r["label"]): r["score"] for r in relations}


def _served(result: inference_pb2.ExtractResult, text: str = TEXT) -> dict[tuple, float]:
    scores = [relation.score for relation in result.relations]
    assert scores == sorted(scores, reverse=True)
    for relation in result.relations:
        for entity in (relation.head, relation.tail):
            assert entity.text == text[entity.start : entity.end]
    return {((r.head.start, r.head.end), (r.tail.start, r.tail.end), r.label): r.score for r in result.relations}


def _assert_same(served: dict[tuple, float], reference: dict[tuple, float]) -> None:
    assert set(served) == set(reference)
    for key, score in reference.items():
        assert abs(served[key] - score) <= 1e-4, key


ENTITY_OPTIONS = {"entities": [{"start": start, "end": end, "label": label} for start, end, label in ENTITIES]}


@pytest.mark.parametrize("threshold", [None, 0.6])
def test_relations_between_request_spans_equal_glirel(glirel_stub, built, threshold: float | None) -> None:
    reference = _reference(built[1], ENTITIES, 0.5 if threshold is None else threshold)
    assert 3 <= len(reference) < len(ENTITIES) * (len(ENTITIES) - 1) * len(LABELS)
    _assert_same(_served(_extract(glirel_stub, ENTITY_OPTIONS, threshold=threshold)), reference)


def test_top_k_keeps_the_best_labels_of_each_pair(glirel_stub, built) -> None:
    reference = _reference(built[1], ENTITIES, 0.0, top_k=1)
    assert len(reference) == len(ENTITIES) * (len(ENTITIES) - 1)
    _assert_same(_served(_extract(glirel_stub, {**ENTITY_OPTIONS, "top_k": 1}, threshold=0.0)), reference)


@pytest.mark.parametrize("entity_labels", [None, ["person", "city"]])
def test_spans_from_gliner(glirel_stub, built, entity_labels: list[str] | None) -> None:
    # The profile's entity labels, or the request's instead.
    found = GLiNER.from_pretrained(str(built[0] / "ner" / "model"), local_files_only=True).inference(
        [TEXT], entity_labels or ["person", "city", "machine"], threshold=0.3
    )[0]
    assert len(found) >= 2
    spans = sorted((e["start"], e["end"], e["label"]) for e in found)
    reference = _reference(built[1], spans, 0.0)
    assert reference
    # Every relation at threshold 0 (more than the 100 an item keeps by default).
    options: dict[str, Any] = {"max_relations": 1000}
    if entity_labels is not None:
        options["entity_labels"] = entity_labels
    _assert_same(_served(_extract(glirel_stub, options, threshold=0.0, profile="ner")), reference)


def test_only_the_words_read_are_related(glirel_stub, built) -> None:
    # The replica reads 64 words (max_len): a span past them is left out, the text up to them is what GLiREL reads.
    long = TEXT + " and" * 70 + " Paris."
    paris = long.index("Paris")
    entities = [*ENTITIES[:2], (paris, paris + 5, "city")]
    read = long[: [match.end() for match in WORD.finditer(long)][63]]
    reference = _reference(built[1], ENTITIES[:2], 0.0, text=read)
    assert len(reference) == 2 * len(LABELS)
    options = {"entities": [{"start": start, "end": end, "label": label} for start, end, label in entities]}
    _assert_same(_served(_extract(glirel_stub, options, threshold=0.0, text=long), long), reference)


@pytest.mark.parametrize(
    ("entities", "reason", "message"),
    [
        ([{"start": 0, "end": len(TEXT) + 1, "label": "x"}] * 2, "INVALID_ITEM", "past the text's"),
        ([{"start": 5, "end": 3, "label": "x"}], "INVALID_OPTIONS", "must be greater than start"),
        ([{"start": 0, "end": 3, "label": "x"}] * 65, "INVALID_OPTIONS", "at most 64 spans"),
        ([{"start": -1, "end": 3, "label": "x"}], "INVALID_OPTIONS", "whole number"),
        ([{"start": 0, "end": 3}], "INVALID_OPTIONS", "exactly start, end and label"),
    ],
)
def test_bad_spans_are_refused(glirel_stub, entities: list[dict[str, Any]], reason: str, message: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(glirel_stub, {"entities": entities})
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == reason
    assert message in raised.value.details()


@pytest.mark.parametrize(
    ("options", "reason", "message"),
    [
        ({}, "INVALID_OPTIONS", "give options.entities"),
        ({**ENTITY_OPTIONS, "top_k": 0}, "INVALID_OPTIONS", "top_k"),
        ({**ENTITY_OPTIONS, "colour": 1}, "UNKNOWN_OPTION", "reads no option 'colour'"),
    ],
)
def test_bad_options_are_refused(glirel_stub, options: dict[str, Any], reason: str, message: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(glirel_stub, options)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == reason
    assert message in raised.value.details()


def test_no_labels_is_refused(glirel_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(glirel_stub, ENTITY_OPTIONS, labels=[])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "NO_LABELS"


@pytest.mark.process
def test_a_worker_without_the_package_answers_dependency_missing(built, tmp_path: Path) -> None:
    # A `glirel` that cannot be imported, first on the worker's path: as if the package were not installed.
    hidden = tmp_path / "no-glirel" / "glirel"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'loguru'\", name='loguru')\n")
    configs = tmp_path / "configs"
    configs.mkdir()
    write_config(configs, MODEL, f"path: {built[0]}\n{CONFIG}")
    path = os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH", "")]))
    worker = WorkerProcess(
        {"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": "", "PYTHONPATH": path}, tmp_path / "worker.log"
    )
    worker.wait_serving()
    try:
        with grpc.insecure_channel(worker.address) as channel, pytest.raises(grpc.RpcError) as raised:
            _extract(inference_pb2_grpc.InferenceStub(channel), ENTITY_OPTIONS)
    finally:
        worker.stop()
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "ADAPTER_DEPENDENCY_MISSING"
    assert (
        "missing module 'loguru'" in raised.value.details() and "pip install glirel --no-deps" in raised.value.details()
    )
