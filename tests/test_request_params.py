"""The reference's parameter shapes on a worker: `options` keys and `params` act as the request's own fields."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2

from conftest import LORA_MODEL
from grpc_helpers import error_info, forward_passes, items, stacked
from sie.v1 import inference_pb2
from sie_common.edge.errors import InvalidArgument
from sie_common.edge.request_bounds import RequestBounds, RequestBoundSettings
from sie_common.edge.request_params import merged_request

MEAN = "test/tiny-mean"  # carries the prompts "query: " and "passage: "
RERANKER = "test/tiny-reranker"
NER = "test/tiny-ner"
TEXTS = ["what is a vector database", "bananas are yellow"]
BOUNDS = RequestBounds(**RequestBounds.fields_from(RequestBoundSettings()))


def struct(values: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


def encode(stub, **fields) -> np.ndarray:
    return stacked(
        r.dense
        for r in stub.Encode(
            inference_pb2.EncodeRequest(model=MEAN, items=items(TEXTS), **fields),
            timeout=60,
        ).results
    )


def refused(call) -> tuple[grpc.StatusCode, str, str]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code(), error_info(raised.value).reason, raised.value.details()


def test_a_query_is_a_query_whichever_way_it_is_asked(stub) -> None:
    document = encode(stub)
    by_field = encode(stub, is_query=True)
    by_option = encode(stub, options=struct({"is_query": True}))
    by_params = encode(stub, params=inference_pb2.EncodeParams(is_query=True))
    assert np.abs(by_field - document).max() > 1e-3, (
        "the query prompt should change the vector"
    )
    np.testing.assert_array_equal(by_option, by_field)
    np.testing.assert_array_equal(by_params, by_field)
    np.testing.assert_array_equal(
        encode(stub, options=struct({"is_query": False})), document
    )


def test_params_give_the_same_answer_as_the_fields(stub) -> None:
    fields = encode(
        stub, dims=8, output_dtype="float16", instruction="find", profile="default"
    )
    params = encode(
        stub,
        params=inference_pb2.EncodeParams(
            dims=8, output_dtype="float16", instruction="find", profile="default"
        ),
    )
    assert fields.shape == (2, 8)
    np.testing.assert_array_equal(params, fields)
    np.testing.assert_array_equal(
        encode(stub, options=struct({"instruction": "find"})),
        encode(stub, instruction="find"),
    )

    query = inference_pb2.ScoreRequest(
        model=RERANKER, query=items(["vector database"])[0], items=items(TEXTS * 2)
    )
    by_field = inference_pb2.ScoreRequest(top_k=1)
    by_field.MergeFrom(query)
    by_params = inference_pb2.ScoreRequest(params=inference_pb2.ScoreParams(top_k=1))
    by_params.MergeFrom(query)
    assert len(stub.Score(by_params, timeout=60).scores) == 1
    assert (
        stub.Score(by_params, timeout=60).scores
        == stub.Score(by_field, timeout=60).scores
    )

    text = ["Ada Lovelace lived in London"]
    extract_field = stub.Extract(
        inference_pb2.ExtractRequest(model=NER, items=items(text), threshold=0.0),
        timeout=60,
    )
    extract_params = stub.Extract(
        inference_pb2.ExtractRequest(
            model=NER,
            items=items(text),
            params=inference_pb2.ExtractParams(threshold=0.0),
        ),
        timeout=60,
    )
    assert extract_field.results[0].entities, "threshold 0 keeps every span"
    assert extract_params.results == extract_field.results


def test_an_options_profile_is_the_profile(stub) -> None:
    code, reason, _ = refused(
        lambda: encode(stub, options=struct({"profile": "no-such-profile"}))
    )
    assert (code, reason) == (grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND")
    np.testing.assert_array_equal(
        encode(stub, options=struct({"profile": "default"})), encode(stub)
    )


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        (
            {"is_query": True, "options": struct({"is_query": False})},
            ("is_query", "options.is_query"),
        ),
        (
            {"profile": "default", "options": struct({"profile": "other"})},
            ("profile", "options.profile"),
        ),
        (
            {"instruction": "a", "params": inference_pb2.EncodeParams(instruction="b")},
            ("instruction", "params.instruction"),
        ),
        (
            {"is_query": True, "params": inference_pb2.EncodeParams(is_query=False)},
            ("is_query", "params.is_query"),
        ),
        (
            {
                "output_types": ["dense"],
                "params": inference_pb2.EncodeParams(output_types=["sparse"]),
            },
            ("output_types", "params.output_types"),
        ),
        (
            {
                "options": struct({"muvera": {"seed": 1}}),
                "params": inference_pb2.EncodeParams(
                    options=struct({"muvera": {"seed": 2}})
                ),
            },
            ("options.muvera", "params.options.muvera"),
        ),
        (
            {
                "params": inference_pb2.EncodeParams(
                    is_query=False, options=struct({"is_query": True})
                )
            },
            ("is_query", "options.is_query"),
        ),
    ],
    ids=[
        "option",
        "profile",
        "params",
        "explicit-false",
        "repeated",
        "params-options",
        "params-and-its-options",
    ],
)
def test_two_values_for_one_parameter_are_refused_naming_both(
    stub, fields, names
) -> None:
    code, reason, message = refused(lambda: encode(stub, **fields))
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CONFLICTING_OPTIONS")
    assert all(name in message for name in names), message


def test_an_option_of_the_wrong_type_is_refused(stub) -> None:
    code, reason, message = refused(
        lambda: encode(stub, options=struct({"is_query": "yes"}))
    )
    assert (code, reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_OPTIONS",
    ) and "options.is_query" in message


def test_bounds_apply_to_a_name_given_as_an_option(stub) -> None:
    code, reason, message = refused(
        lambda: encode(stub, options=struct({"lora": "x" * 300}))
    )
    assert (code, reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "NAME_TOO_LONG",
    ) and "lora" in message
    code, reason, _ = refused(
        lambda: encode(stub, params=inference_pb2.EncodeParams(profile="p" * 300))
    )
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "NAME_TOO_LONG")


def test_the_option_and_the_field_share_a_forward_pass(batching_stub) -> None:
    """The folded keys leave `options`, so both requests have one batch key (the worker waits 300 ms for a batch)."""
    requests = [
        inference_pb2.EncodeRequest(
            model=LORA_MODEL, items=items(["first"]), is_query=True
        ),
        inference_pb2.EncodeRequest(
            model=LORA_MODEL,
            items=items(["second"]),
            options=struct({"is_query": True}),
        ),
    ]
    batching_stub.Encode(requests[0], timeout=60)  # loaded and warm
    before = forward_passes(batching_stub, LORA_MODEL)
    futures = [batching_stub.Encode.future(request, timeout=60) for request in requests]
    assert all(future.result().results for future in futures)
    assert forward_passes(batching_stub, LORA_MODEL) - before == 1


def test_merging_is_a_fixed_point() -> None:
    request = inference_pb2.EncodeRequest(
        model=MEAN,
        items=items(TEXTS),
        options=struct({"is_query": True, "lora": "alpha", "muvera": {"seed": 3}}),
        params=inference_pb2.EncodeParams(
            output_types=["sparse"], dims=4, options=struct({"k": 1})
        ),
    )
    merged = merged_request(request, BOUNDS)
    assert not merged.HasField("params")
    assert (merged.is_query, merged.lora, list(merged.output_types), merged.dims) == (
        True,
        "alpha",
        ["sparse"],
        4,
    )
    assert dict(merged.options) == {"muvera": struct({"seed": 3}), "k": 1.0}
    assert merged_request(merged, BOUNDS) is merged
    assert request.HasField("params") and "is_query" in request.options.fields, (
        "the caller's message is left as it was"
    )
    plain = inference_pb2.EncodeRequest(model=MEAN, items=items(TEXTS))
    assert merged_request(plain, BOUNDS) is plain


def test_score_keeps_an_is_query_option_it_has_no_field_for() -> None:
    request = inference_pb2.ScoreRequest(
        model=RERANKER, options=struct({"is_query": True, "lora": "alpha"})
    )
    merged = merged_request(request, BOUNDS)
    assert merged.lora == "alpha" and dict(merged.options) == {"is_query": True}
    with pytest.raises(InvalidArgument):
        merged_request(
            inference_pb2.ScoreRequest(
                model=RERANKER, lora="a", params=inference_pb2.ScoreParams(lora="b")
            ),
            BOUNDS,
        )


def test_an_option_key_set_to_null_is_not_given(stub) -> None:
    """`options={"lora": None, "is_query": None}` (an integration passing its defaults on) is the plain
    request, as `"lora": null` in the body is; it used to be INVALID_OPTIONS."""
    nulls = struct(
        {key: None for key in ("is_query", "lora", "instruction", "profile")}
    )
    np.testing.assert_array_equal(encode(stub, options=nulls), encode(stub))
    merged = merged_request(
        inference_pb2.EncodeRequest(model=MEAN, is_query=True, options=nulls), BOUNDS
    )
    assert merged.is_query and not merged.options.fields
