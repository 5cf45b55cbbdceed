"""Answers too large for a message (sie_common.edge.answer_size), in-process: the estimate refuses an encode before
any work only where items x dims x dtype already pass the limit, never one that would fit; a built answer is
measured with room for the envelope a stream wraps it in."""

from __future__ import annotations

import pytest

from sie.v1 import inference_pb2, types_pb2
from sie_common.cluster.model_config import ModelConfig
from sie_common.edge.answer_size import ENVELOPE_BYTES, check_answer, check_dense_estimate, check_encode_estimate
from sie_common.edge.errors import ResourceExhausted

SETTING = "SIE_MAX_SEND_MESSAGE_BYTES"
CONFIG = ModelConfig(id="m", source="test", output_types=("dense", "sparse"), dims=384)


def estimate(items: int, dims: int, dtype: str, limit: int, value_bytes: int | None = None) -> ResourceExhausted | None:
    try:
        check_dense_estimate(items, dims, dtype, limit, SETTING, value_bytes)
    except ResourceExhausted as error:
        return error
    return None


@pytest.mark.parametrize(("dtype", "bytes_per_vector"), [("float32", 400), ("float16", 200), ("int8", 100), ("uint8", 100), ("binary", 13), ("ubinary", 13)])
def test_each_dtype_counts_its_own_bytes_and_binary_packs_eight_values_a_byte(dtype: str, bytes_per_vector: int) -> None:
    limit = 10 * bytes_per_vector + ENVELOPE_BYTES
    assert estimate(10, 100, dtype, limit) is None  # exactly at the limit, envelope included
    error = estimate(11, 100, dtype, limit)
    assert error is not None and error.reason == "RESPONSE_TOO_LARGE"
    assert error.metadata == {"limit": str(limit), "size": str(11 * bytes_per_vector)}


def test_the_refusal_says_what_to_change_and_that_it_is_an_estimate() -> None:
    error = estimate(1000, 1024, "float32", 1_000_000)
    assert error is not None
    assert error.message == (
        "the answer would take at least 4096000 bytes, more than the 1000000 bytes a message may carry "
        f"({SETTING}); send fewer items, fewer dims or a smaller output_dtype"
    )


def test_unknown_dims_or_dtype_refuse_nothing() -> None:
    assert estimate(10**6, 0, "float32", 10) is None
    assert estimate(10**6, 384, "float64", 10) is None  # an unknown dtype is the request check's to refuse


def test_numbers_spelled_out_count_their_own_width() -> None:
    """A JSON caller's answer spells each number out (`value_bytes` each), whatever the output dtype."""
    assert estimate(10, 100, "binary", 1000 + ENVELOPE_BYTES) is None
    assert estimate(10, 100, "binary", 1000 + ENVELOPE_BYTES, value_bytes=12) is not None


def request(count: int, **fields: object) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(text="x")] * count, **fields)


def test_an_encode_is_estimated_with_the_smaller_of_its_dims_and_the_models() -> None:
    limit = 100 * 384 * 4 + ENVELOPE_BYTES
    check_encode_estimate(request(100), CONFIG, limit, SETTING)
    with pytest.raises(ResourceExhausted):
        check_encode_estimate(request(101), CONFIG, limit, SETTING)
    check_encode_estimate(request(101, dims=64), CONFIG, limit, SETTING)  # the request cuts the vectors
    with pytest.raises(ResourceExhausted):  # asking for more dims than the model has leaves the model's
        check_encode_estimate(request(101, dims=4096), CONFIG, limit, SETTING)


def test_an_encode_without_dense_is_not_estimated() -> None:
    check_encode_estimate(request(10**5, output_types=["sparse"]), CONFIG, 10, SETTING)
    sparse_first = ModelConfig(id="m", source="test", output_types=("sparse", "dense"), dims=384)
    check_encode_estimate(request(10**5), sparse_first, 10, SETTING)  # its default output is sparse
    with pytest.raises(ResourceExhausted):
        check_encode_estimate(request(10**5, output_types=["dense"]), sparse_first, 10, SETTING)


def test_a_model_without_dims_is_not_estimated_whatever_dims_the_request_asks_for() -> None:
    """Only the model tells its width; dims past it are the worker's DIMS_TOO_LARGE, not an answer too large."""
    for dims in (None, 64, 2**31 - 1):
        check_encode_estimate(request(10**5, dims=dims), ModelConfig(id="m", source="test"), 10, SETTING)


def test_a_built_answer_is_measured_with_room_for_its_envelope() -> None:
    answer = inference_pb2.EncodeResponse(request_id="r" * 100)
    size = answer.ByteSize()
    check_answer(answer, size + ENVELOPE_BYTES, SETTING)
    with pytest.raises(ResourceExhausted) as raised:
        check_answer(answer, size + ENVELOPE_BYTES - 1, SETTING)
    assert raised.value.message.startswith(f"the answer takes {size} bytes")
    assert raised.value.metadata == {"limit": str(size + ENVELOPE_BYTES - 1), "size": str(size)}
