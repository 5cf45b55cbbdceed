"""The worker's conversions between sie.v1 messages and its own jobs and outcomes (sie_worker.api.convert),
in-process: what a request's own fields become or are refused with, and how an outcome is written back in the
request's order, ids and ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from google.protobuf import duration_pb2, struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.edge.errors import InvalidArgument
from sie_contract.tensors import from_tensor
from sie_worker.adapters.items import Entity, Extraction, SparseWeights
from sie_worker.api.convert import (
    encode_job,
    encode_response,
    extract_job,
    extract_response,
    score_job,
    score_response,
    work_timeout,
)
from sie_worker.engine.jobs import (
    EncodedOutput,
    EncodeOutcome,
    ExtractOutcome,
    ImageInput,
    ScoredItem,
    ScoreOutcome,
    Timing,
)
from sie_worker.engine.limits import Limits
from sie_worker.engine.postprocess import Quantized
from sie_worker.settings import WorkerSettings

LIMITS = Limits.from_settings(WorkerSettings(max_request_timeout_s=60))
TIMING = Timing(queue_ms=1.0, tokenization_ms=2.0, inference_ms=3.0, postprocessing_ms=4.0, total_ms=10.0)


def items(*texts: str) -> list[types_pb2.Item]:
    return [types_pb2.Item(id=f"id-{index}", text=text) for index, text in enumerate(texts)]


def refusal(convert, request) -> InvalidArgument:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidArgument) as raised:
        convert(request, LIMITS)
    return raised.value


def test_an_encode_request_becomes_its_job() -> None:
    options = struct_pb2.Struct()
    options.update({"muvera": {"seed": 3}})
    request = inference_pb2.EncodeRequest(
        model="m",
        items=[*items("a"), types_pb2.Item(images=[types_pb2.Image(data=b"\x89PNG", format="png")])],
        output_types=["sparse", "dense", "sparse"],
        output_dtype="int8",
        instruction="",
        is_query=True,
        dims=8,
        profile="p",
        lora="l",
        options=options,
        debug=True,
    )
    job = encode_job(request, LIMITS)
    assert job.output_types == ("sparse", "dense")  # once each, in the order asked
    assert (job.output_dtype, job.instruction, job.is_query, job.dims, job.profile, job.lora, job.debug) == (
        "int8", "", True, 8, "p", "l", True,
    )
    assert job.options == {"muvera": {"seed": 3}}
    assert [(item.text, item.images, item.id, item.position) for item in job.items] == [
        ("a", (), "id-0", 0),
        (None, (ImageInput(b"\x89PNG", "png"),), "", 1),
    ]


def test_fields_left_unset_keep_the_models_defaults() -> None:
    job = encode_job(inference_pb2.EncodeRequest(model="m", items=items("a")), LIMITS)
    assert (job.output_types, job.output_dtype, job.instruction, job.dims, job.options) == ((), "float32", None, None, {})


def test_params_and_option_aliases_reach_the_job() -> None:
    options = struct_pb2.Struct()
    options.update({"is_query": True, "k": 1})
    request = inference_pb2.EncodeRequest(
        model="m", items=items("a"), options=options, params=inference_pb2.EncodeParams(dims=4, lora="l")
    )
    job = encode_job(request, LIMITS)
    assert (job.is_query, job.dims, job.lora, job.options) == (True, 4, "l", {"k": 1.0})


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (inference_pb2.EncodeRequest(items=items("a")), "MISSING_MODEL"),
        (inference_pb2.EncodeRequest(model="m"), "NO_ITEMS"),
        (inference_pb2.EncodeRequest(model="m", items=items("a"), output_types=["dense", "colour"]), "UNKNOWN_OUTPUT_TYPE"),
        (inference_pb2.EncodeRequest(model="m", items=items("a"), output_dtype="float64"), "UNKNOWN_OUTPUT_DTYPE"),
        (inference_pb2.EncodeRequest(model="m", items=items("a"), dims=0), "INVALID_DIMS"),
        (inference_pb2.EncodeRequest(model="m", items=items("a"), dims=-3), "INVALID_DIMS"),
    ],
    ids=["no model", "no items", "output type", "dtype", "zero dims", "negative dims"],
)
def test_an_encode_field_out_of_its_domain_is_refused_with_its_reason(request_, reason: str) -> None:
    assert refusal(encode_job, request_).reason == reason


def test_an_item_without_text_or_images_is_named_by_index_and_id() -> None:
    error = refusal(encode_job, inference_pb2.EncodeRequest(model="m", items=[*items("a"), types_pb2.Item(id="cat")]))
    assert error.reason == "ITEM_WITHOUT_TEXT"
    assert error.metadata == {"item": "1", "item_id": "cat"}
    assert error.message == "items[1] (id 'cat'): has no text (and no images)"


def test_an_empty_text_is_a_text() -> None:
    assert encode_job(inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(text="")]), LIMITS).items[0].text == ""


def test_a_huge_item_id_is_cut_in_the_error_that_names_it() -> None:
    error = refusal(encode_job, inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(id="i" * 100_000)]))
    assert len(error.message) < 300 and error.metadata["item_id"].endswith("...")


def test_an_unknown_output_type_is_cut_before_it_is_echoed() -> None:
    error = refusal(encode_job, inference_pb2.EncodeRequest(model="m", items=items("a"), output_types=["x" * 10_000]))
    assert len(error.message) < 400 and "(10000 characters)" in error.metadata["output_type"]


def test_options_that_are_not_plain_json_are_refused() -> None:
    options = struct_pb2.Struct()
    options.fields["k"].number_value = math.nan
    error = refusal(encode_job, inference_pb2.EncodeRequest(model="m", items=items("a"), options=options))
    assert error.reason == "INVALID_OPTIONS"


def test_a_score_request_becomes_its_job() -> None:
    request = inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(id="q", text="query"), items=items("a", "b"))
    job = score_job(request, LIMITS)
    assert (job.query.text, job.query.id, job.query.position, job.query.label) == ("query", "q", None, "query (id 'q')")
    assert [item.text for item in job.items] == ["a", "b"] and job.top_k is None  # 0: all
    assert score_job(inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(text="q"), items=items("a"), top_k=1), LIMITS).top_k == 1


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (inference_pb2.ScoreRequest(model="m", items=items("a")), "MISSING_QUERY"),
        (inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(text="q"), items=items("a"), top_k=-1), "INVALID_TOP_K"),
        (inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(text="q")), "NO_ITEMS"),
    ],
    ids=["no query", "negative top_k", "no items"],
)
def test_a_score_field_out_of_its_domain_is_refused_with_its_reason(request_, reason: str) -> None:
    assert refusal(score_job, request_).reason == reason


def test_an_extract_request_keeps_each_label_once_in_order() -> None:
    request = inference_pb2.ExtractRequest(model="m", items=items("a"), labels=["city", "person", "city"], threshold=0.0)
    job = extract_job(request, LIMITS)
    assert job.labels == ("city", "person") and job.threshold == 0.0
    assert extract_job(inference_pb2.ExtractRequest(model="m", items=items("a")), LIMITS).threshold is None


def test_an_extract_threshold_outside_zero_to_one_is_refused() -> None:
    assert refusal(extract_job, inference_pb2.ExtractRequest(model="m", items=items("a"), threshold=1.5)).reason == "INVALID_THRESHOLD"


def test_an_encode_outcome_is_written_in_the_requests_order_with_its_ids() -> None:
    request = inference_pb2.EncodeRequest(request_id="r", model="m", items=items("a", "b"))
    vectors = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    sparse = SparseWeights(indices=np.array([5, 9]), values=np.array([0.5, 0.25], dtype=np.float32), dims=30522)
    outcome = EncodeOutcome(
        model="m@default",
        items=[EncodedOutput(dense=Quantized(vectors[0], "float32")), EncodedOutput(dense=Quantized(vectors[1], "float32"), sparse=sparse)],
        timing=TIMING,
        tokens=7,
    )
    answer = encode_response(request, outcome)
    assert (answer.request_id, answer.model, answer.tokens) == ("r", "m@default", 7)
    assert [result.id for result in answer.results] == ["id-0", "id-1"]
    np.testing.assert_array_equal(np.stack([from_tensor(result.dense) for result in answer.results]), vectors)
    assert not answer.results[0].HasField("sparse") and not answer.results[0].HasField("multivector")
    assert (list(answer.results[1].sparse.indices), answer.results[1].sparse.dims) == ([5, 9], 30522)
    assert (answer.timing.queue_ms, answer.timing.total_ms) == (1.0, 10.0)


def test_an_outcome_that_lost_an_item_is_not_written() -> None:
    request = inference_pb2.EncodeRequest(model="m", items=items("a", "b"))
    with pytest.raises(ValueError):
        encode_response(request, EncodeOutcome(model="m", items=[EncodedOutput()], timing=TIMING))


def test_scores_are_written_best_first_with_their_ranks_and_the_items_ids() -> None:
    request = inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(text="q"), items=items("a", "b", "c"))
    outcome = ScoreOutcome(model="m", ranked=[ScoredItem(2, 0.9), ScoredItem(0, 0.5)], timing=TIMING)
    answer = score_response(request, outcome)
    assert [(entry.item_id, entry.index, entry.rank) for entry in answer.scores] == [("id-2", 2, 0), ("id-0", 0, 1)]
    assert [entry.score for entry in answer.scores] == pytest.approx([0.9, 0.5])


def test_extractions_are_written_per_item() -> None:
    request = inference_pb2.ExtractRequest(model="m", items=items("Ada lives in Paris", "nothing"))
    found = Extraction(entities=[Entity(text="Paris", label="city", score=0.75, start=13, end=18)], data={"k": "v"})
    answer = extract_response(request, ExtractOutcome(model="m", results=[found, Extraction()], timing=TIMING))
    (entity,) = answer.results[0].entities
    assert (entity.text, entity.label, entity.start, entity.end) == ("Paris", "city", 13, 18)
    assert dict(answer.results[0].data) == {"k": "v"}
    assert [result.id for result in answer.results] == ["id-0", "id-1"] and not answer.results[1].entities


@pytest.mark.parametrize(
    ("seconds", "nanos", "expected"),
    [(1, 500_000_000, 1.5), (0, 0, 0.0), (-5, 0, -5.0), (3600, 0, 60.0), (2**62, 0, 60.0)],
    ids=["within", "zero", "expired", "over the cap", "past a timedelta"],
)
def test_a_work_timeout_is_cut_to_the_cap_and_never_overflows(seconds: int, nanos: int, expected: float) -> None:
    assert work_timeout(duration_pb2.Duration(seconds=seconds, nanos=nanos), LIMITS) == expected
