"""One request shape from a field, `params.<field>` and `options.<key>` (sie_common.edge.request_params), in-process:
which value wins, which disagreements are refused and how they are named, and what is left of the options."""

from __future__ import annotations

import math

import pytest
from google.protobuf import struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.edge.errors import InvalidArgument
from sie_common.edge.request_bounds import RequestBounds, RequestBoundSettings
from sie_common.edge.request_params import merged_request

BOUNDS = RequestBounds(**RequestBounds.fields_from(RequestBoundSettings()))
ITEMS = [types_pb2.Item(text="x")]


def struct(values: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


def conflict(request: object) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as raised:
        merged_request(request, BOUNDS)
    assert raised.value.reason == "CONFLICTING_OPTIONS"
    return raised.value


def test_params_fill_the_fields_and_leave_no_params() -> None:
    request = inference_pb2.ExtractRequest(
        model="m", items=ITEMS, params=inference_pb2.ExtractParams(labels=["a", "b"], threshold=0.25, profile="p")
    )
    merged = merged_request(request, BOUNDS)
    assert (list(merged.labels), merged.threshold, merged.profile) == (["a", "b"], 0.25, "p")
    assert not merged.HasField("params")


def test_the_same_value_in_two_places_is_no_conflict() -> None:
    request = inference_pb2.EncodeRequest(
        model="m", items=ITEMS, lora="a", options=struct({"lora": "a"}), params=inference_pb2.EncodeParams(lora="a")
    )
    merged = merged_request(request, BOUNDS)
    assert merged.lora == "a" and "lora" not in merged.options.fields


def test_a_field_and_a_param_that_disagree_are_named_both() -> None:
    error = conflict(inference_pb2.EncodeRequest(model="m", items=ITEMS, dims=8, params=inference_pb2.EncodeParams(dims=16)))
    assert error.metadata == {"field": "dims", "other": "params.dims"}
    assert error.message == "dims and params.dims disagree; set one of them (or the same value in both)"


def test_a_param_and_an_option_that_disagree_are_named_both() -> None:
    error = conflict(
        inference_pb2.EncodeRequest(
            model="m", items=ITEMS, options=struct({"is_query": False}), params=inference_pb2.EncodeParams(is_query=True)
        )
    )
    assert error.metadata == {"field": "params.is_query", "other": "options.is_query"}


def test_an_explicit_false_disagrees_where_a_plain_field_left_false_does_not() -> None:
    """`false` in params (a field with presence) or options is a value given; a plain proto3 field left false is not."""
    error = conflict(
        inference_pb2.EncodeRequest(
            model="m", items=ITEMS, params=inference_pb2.EncodeParams(is_query=False), options=struct({"is_query": True})
        )
    )
    assert error.metadata == {"field": "params.is_query", "other": "options.is_query"}
    merged = merged_request(
        inference_pb2.EncodeRequest(model="m", items=ITEMS, is_query=False, options=struct({"is_query": True})), BOUNDS
    )
    assert merged.is_query is True


def test_an_option_set_to_null_counts_as_not_given() -> None:
    request = inference_pb2.EncodeRequest(model="m", items=ITEMS, lora="a", options=struct({"lora": None, "k": 1}))
    merged = merged_request(request, BOUNDS)
    assert merged.lora == "a" and dict(merged.options) == {"k": 1.0}


@pytest.mark.parametrize(("key", "value", "wanted"), [("is_query", "yes", "true or false"), ("lora", 3, "a string"), ("profile", True, "a string")])
def test_an_option_of_the_wrong_type_says_what_it_must_be(key: str, value: object, wanted: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        merged_request(inference_pb2.EncodeRequest(model="m", items=ITEMS, options=struct({key: value})), BOUNDS)
    assert raised.value.reason == "INVALID_OPTIONS" and raised.value.metadata == {"option": key}
    assert raised.value.message == f"options.{key} must be {wanted} (it stands for the request's {key} field)"


def test_params_options_join_the_options_and_a_key_in_both_must_agree() -> None:
    request = inference_pb2.EncodeRequest(
        model="m", items=ITEMS, options=struct({"a": 1}), params=inference_pb2.EncodeParams(options=struct({"b": 2}))
    )
    assert dict(merged_request(request, BOUNDS).options) == {"a": 1.0, "b": 2.0}
    error = conflict(
        inference_pb2.EncodeRequest(
            model="m", items=ITEMS, options=struct({"a": 1}), params=inference_pb2.EncodeParams(options=struct({"a": 2}))
        )
    )
    assert error.metadata == {"field": "options.a", "other": "params.options.a"}


def test_a_long_option_key_is_clipped_in_the_conflict_it_causes() -> None:
    key = "k" * 200  # under SIE_MAX_NAME_BYTES (a longer key is KEY_TOO_LONG before it can conflict)
    error = conflict(
        inference_pb2.EncodeRequest(
            model="m", items=ITEMS, options=struct({key: 1}), params=inference_pb2.EncodeParams(options=struct({key: 2}))
        )
    )
    assert len(error.message) < 400 and "(200 characters)" in error.metadata["field"]


def test_a_float_param_equal_at_the_fields_precision_is_no_conflict() -> None:
    """0.1 as the float field holds it and 0.1 as a double are one value; 0.1 and 0.2 are not."""
    request = inference_pb2.ExtractRequest(model="m", items=ITEMS, threshold=0.1, params=inference_pb2.ExtractParams(threshold=0.1))
    assert merged_request(request, BOUNDS).threshold == pytest.approx(0.1)
    conflict(inference_pb2.ExtractRequest(model="m", items=ITEMS, threshold=0.1, params=inference_pb2.ExtractParams(threshold=0.2)))


def test_the_same_nan_twice_is_left_for_the_threshold_check_to_refuse() -> None:
    request = inference_pb2.ExtractRequest(
        model="m", items=ITEMS, threshold=math.nan, params=inference_pb2.ExtractParams(threshold=math.nan)
    )
    assert math.isnan(merged_request(request, BOUNDS).threshold)


def test_options_inside_params_are_bounded_before_they_are_merged() -> None:
    deep = struct_pb2.Struct()
    value = deep.fields["k"]
    for _ in range(BOUNDS.options_depth):
        value = value.struct_value.fields["k"]
    value.number_value = 1
    with pytest.raises(InvalidArgument) as raised:
        merged_request(inference_pb2.EncodeRequest(model="m", items=ITEMS, params=inference_pb2.EncodeParams(options=deep)), BOUNDS)
    assert raised.value.reason == "OPTIONS_TOO_LARGE"
