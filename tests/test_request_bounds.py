"""The bounds on a request's own fields (sie_common.edge.request_bounds), checked in-process: which field is over
which bound, the reason and metadata a caller gets, and the values exactly at a bound that still pass."""

from __future__ import annotations

import dataclasses
import math

import pytest
from google.protobuf import struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.edge.errors import InvalidArgument
from sie_common.edge.request_bounds import (
    RequestBounds,
    RequestBoundSettings,
    check_options,
    check_request,
    over_limit,
)
from sie_common.runtime.settings import SettingsError

BOUNDS = RequestBounds(
    items=3,
    text_bytes=16,
    instruction_bytes=8,
    name_bytes=10,
    labels=2,
    options_bytes=200,
    options_depth=3,
    image_bytes=32,
    metadata_bytes=64,
)


def refusal(request: object) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as raised:
        check_request(request, BOUNDS)
    return raised.value


def items(*texts: str) -> list[types_pb2.Item]:
    return [types_pb2.Item(text=text) for text in texts]


def nested(depth: int) -> struct_pb2.Struct:
    """Options `depth` levels deep (the struct itself is level 1), lists and objects in turn below it."""
    options = struct_pb2.Struct()
    value = options.fields["k"]
    for level in range(depth - 1):
        value = value.list_value.values.add() if level % 2 == 0 else value.struct_value.fields["k"]
    value.number_value = 1
    return options


def test_a_request_at_every_bound_passes() -> None:
    request = inference_pb2.ExtractRequest(
        model="m" * 10,
        profile="p" * 10,
        lora="l" * 10,
        items=[types_pb2.Item(text="t" * 16, images=[types_pb2.Image(data=b"i" * 32)]), *items("a", "b")],
        labels=["a" * 10, "b"],
        threshold=1.0,
        options=nested(3),
    )
    check_request(request, BOUNDS)
    check_request(inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(text="q" * 16), instruction="i" * 8), BOUNDS)


@pytest.mark.parametrize("field", ["model", "profile", "lora"])
def test_a_name_over_its_bound_names_the_field_the_limit_and_the_setting(field: str) -> None:
    error = refusal(inference_pb2.EncodeRequest(items=items("x"), **{"model": "m", field: "n" * 11}))
    assert error.reason == "NAME_TOO_LONG"
    assert error.metadata == {"field": field, "limit": "10", "setting": "SIE_MAX_NAME_BYTES"}
    assert error.message == f"{field}: 11 bytes; the limit is 10 (SIE_MAX_NAME_BYTES)"


def test_text_is_measured_in_utf8_bytes_not_characters() -> None:
    four_bytes = "\N{GRINNING FACE}"
    check_request(inference_pb2.EncodeRequest(model="m", items=items(four_bytes * 4)), BOUNDS)  # 16 bytes
    error = refusal(inference_pb2.EncodeRequest(model="m", items=items("x", "é" * 8 + "y")))  # 9 characters, 17 bytes
    assert error.reason == "TEXT_TOO_LONG"
    assert error.metadata == {"item": "1", "limit": "16", "setting": "SIE_MAX_TEXT_BYTES"}
    assert error.message.startswith("items[1]: text of 17 bytes")


def test_a_score_query_is_bounded_like_an_item_and_named_query() -> None:
    error = refusal(inference_pb2.ScoreRequest(model="m", query=types_pb2.Item(text="q" * 17), items=items("x")))
    assert (error.reason, error.metadata["item"]) == ("TEXT_TOO_LONG", "query")


def test_too_many_items_is_refused_before_any_item_is_read() -> None:
    error = refusal(inference_pb2.EncodeRequest(model="m", items=items("x" * 1000, "b", "c", "d")))
    assert error.reason == "TOO_MANY_ITEMS"  # not TEXT_TOO_LONG: the count is checked first
    assert error.metadata == {"limit": "3", "setting": "SIE_MAX_ITEMS_PER_REQUEST"}


def test_an_image_over_its_bound_says_how_to_make_it_fit() -> None:
    image = types_pb2.Image(data=b"i" * 33)
    error = refusal(inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(id="a"), types_pb2.Item(images=[image])]))
    assert error.reason == "IMAGE_TOO_LARGE" and error.metadata["item"] == "1"
    assert error.message.endswith("(SIE_MAX_IMAGE_BYTES): compress or downscale it")


def test_an_instruction_over_its_bound_says_it_is_prepended_to_every_item() -> None:
    error = refusal(inference_pb2.EncodeRequest(model="m", items=items("x"), instruction="i" * 9))
    assert error.reason == "INSTRUCTION_TOO_LONG"
    assert "prepended to every item" in error.message and error.metadata["setting"] == "SIE_MAX_INSTRUCTION_BYTES"


def test_labels_are_bounded_in_number_and_each_in_length() -> None:
    too_many = refusal(inference_pb2.ExtractRequest(model="m", items=items("x"), labels=["a", "b", "c"]))
    assert (too_many.reason, too_many.metadata["limit"]) == ("TOO_MANY_LABELS", "2")
    too_long = refusal(inference_pb2.ExtractRequest(model="m", items=items("x"), labels=["a", "l" * 11]))
    assert (too_long.reason, too_long.metadata["field"]) == ("NAME_TOO_LONG", "labels")


@pytest.mark.parametrize("threshold", [-0.01, 1.01, math.nan, math.inf, -math.inf])
def test_a_threshold_must_be_a_probability(threshold: float) -> None:
    error = refusal(inference_pb2.ExtractRequest(model="m", items=items("x"), threshold=threshold))
    assert error.reason == "INVALID_THRESHOLD"


def test_a_threshold_of_zero_is_given_not_unset() -> None:
    check_request(inference_pb2.ExtractRequest(model="m", items=items("x"), threshold=0.0), BOUNDS)


def test_options_depth_counts_objects_and_lists_and_stops_at_the_bound() -> None:
    check_options(nested(3), BOUNDS)
    with pytest.raises(InvalidArgument) as raised:
        check_options(nested(4), BOUNDS)
    assert raised.value.reason == "OPTIONS_TOO_LARGE"
    assert raised.value.metadata == {"limit": "3", "setting": "SIE_MAX_OPTIONS_DEPTH"}
    assert "nested 4 levels deep" in raised.value.message


def test_options_depth_of_a_very_deep_struct_is_checked_without_recursion() -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_options(nested(1500), dataclasses.replace(BOUNDS, options_bytes=10**9))  # past Python's recursion limit
    assert raised.value.metadata["setting"] == "SIE_MAX_OPTIONS_DEPTH"


def test_options_size_is_the_serialized_size() -> None:
    options = struct_pb2.Struct()
    options.update({"k": "v" * 300})
    with pytest.raises(InvalidArgument) as raised:
        check_request(inference_pb2.EncodeRequest(model="m", items=items("x"), options=options), BOUNDS)
    assert raised.value.reason == "OPTIONS_TOO_LARGE"
    assert raised.value.metadata == {"limit": "200", "setting": "SIE_MAX_OPTIONS_BYTES"}
    assert raised.value.message.startswith(f"options: {options.ByteSize()} bytes")


def test_a_limit_that_is_not_whole_is_shown_as_it_is() -> None:
    error = over_limit("ratio: 12.5", reason="R", limit=2.5, setting="SIE_X", advice="crop it")
    assert error.message == "ratio: 12.5; the limit is 2.5 (SIE_X): crop it"
    assert error.metadata == {"limit": "2.5", "setting": "SIE_X"}
    assert over_limit("n", reason="R", limit=4.0, setting="SIE_X").metadata["limit"] == "4"


@pytest.mark.parametrize("field", ["max_items_per_request", "max_text_bytes", "max_options_depth", "max_image_bytes"])
@pytest.mark.parametrize("value", [0, -1])
def test_a_bound_that_is_not_positive_refuses_to_start(field: str, value: int) -> None:
    with pytest.raises(SettingsError, match=r"SIE_MAX_\w+=" + str(value) + ": must be positive"):
        RequestBoundSettings(**{field: value})


def test_the_settings_give_the_bounds_field_by_field() -> None:
    settings = RequestBoundSettings(max_items_per_request=7, max_labels=5, max_image_bytes=9)
    bounds = RequestBounds(**RequestBounds.fields_from(settings))
    assert (bounds.items, bounds.labels, bounds.image_bytes) == (7, 5, 9)
    assert bounds.text_bytes == RequestBoundSettings().max_text_bytes
