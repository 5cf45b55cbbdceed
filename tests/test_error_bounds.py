"""Every error's message and ErrorInfo metadata are bounded once, in SieError (and for statuses passed on, in
abort_with_status), so no caller value repeated in an error can push a status past gRPC's metadata limit (which
answered RESOURCE_EXHAUSTED, HTTP 429, instead of the error); and the request bounds added for issue 32."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import struct_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.edge.errors import MAX_MESSAGE_CHARS, MAX_METADATA_CHARS, InvalidArgument, abort_with_status, bounded
from sie_common.edge.openai_embeddings import encode_request
from sie_common.edge.request_bounds import (
    MAX_IMAGE_FORMAT_BYTES,
    MAX_USER_BYTES,
    RequestBounds,
    RequestBoundSettings,
    check_item_fields,
    check_options,
    check_request,
)

BOUNDS = RequestBounds(**RequestBounds.fields_from(RequestBoundSettings()))


def test_a_long_message_keeps_its_start_and_its_advice() -> None:
    error = InvalidArgument(f"options: unknown key '{'k' * 20_000}'; send one of a, b", reason="X", metadata={"key": "k" * 5000})
    assert len(error.message) <= MAX_MESSAGE_CHARS + 40
    assert error.message.startswith("options: unknown key 'kkk") and error.message.endswith("; send one of a, b")
    assert "characters left out" in error.message
    assert len(error.metadata["key"]) <= MAX_METADATA_CHARS + 40
    status = error.to_status()
    assert len(status.SerializeToString()) < 4096, "fits gRPC's 8 KiB metadata soft limit twice (message + details)"
    assert bounded("short", 10) == "short"


async def test_a_status_passed_on_is_bounded_too() -> None:
    from google.rpc import status_pb2

    class Context:
        async def abort(self, code, message, trailing_metadata=()):
            self.message = message
            raise grpc.aio.AbortError()

    context = Context()
    with pytest.raises(grpc.aio.AbortError):
        await abort_with_status(context, status_pb2.Status(code=3, message="m" * 50_000))  # type: ignore[arg-type]
    assert len(context.message) <= MAX_MESSAGE_CHARS + 40


def item(**fields) -> types_pb2.Item:
    return types_pb2.Item(text="x", **fields)


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (inference_pb2.EncodeRequest(model="m", items=[item(metadata=struct_pb2.Struct(fields={"m": struct_pb2.Value(string_value="v" * 20_000)}))]), "METADATA_TOO_LARGE"),
        (inference_pb2.EncodeRequest(model="m", items=[item(metadata=struct_pb2.Struct(fields={"k" * 300: struct_pb2.Value(number_value=1)}))]), "KEY_TOO_LONG"),
        (inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(images=[types_pb2.Image(data=b"x", format="p" * (MAX_IMAGE_FORMAT_BYTES + 1))])]), "IMAGE_FORMAT_TOO_LONG"),
        (inference_pb2.EncodeRequest(model="m", items=[item()], options=struct_pb2.Struct(fields={"k" * 300: struct_pb2.Value(number_value=1)})), "KEY_TOO_LONG"),
    ],
    ids=["metadata-size", "metadata-key", "format-hint", "option-key"],
)
def test_the_new_bounds_refuse_with_their_reasons(request_, reason) -> None:
    with pytest.raises(InvalidArgument) as raised:
        check_request(request_, BOUNDS)
    assert raised.value.reason == reason


def test_what_fits_the_bounds_passes() -> None:
    nested = struct_pb2.Struct()
    nested.update({"k" * 256: {"a": [1, 2, {"b": "c"}]}})
    check_options(nested, BOUNDS)
    check_item_fields(types_pb2.Item(metadata=nested, images=[types_pb2.Image(format="image/webp")]), "items[0]", {}, BOUNDS)
    encode_request(inference_pb2.CreateEmbeddingsRequest(model="m", input=struct_pb2.Value(string_value="x"), user="u" * MAX_USER_BYTES))


def test_the_openai_user_is_bounded() -> None:
    with pytest.raises(InvalidArgument) as raised:
        encode_request(inference_pb2.CreateEmbeddingsRequest(model="m", input=struct_pb2.Value(string_value="x"), user="u" * (MAX_USER_BYTES + 1)))
    assert raised.value.reason == "USER_TOO_LONG" and raised.value.metadata["limit"] == str(MAX_USER_BYTES)
