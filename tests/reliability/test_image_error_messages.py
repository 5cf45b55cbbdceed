"""Image refusals say what is wrong with the bytes, and nothing of the worker's memory (issue 32, defect 8: empty
image bytes answered "cannot identify image file <_io.BytesIO object at 0x7f...>")."""

from __future__ import annotations

import re

import grpc
import pytest

from grpc_helpers import error_info
from sie.v1 import inference_pb2, types_pb2

CLIP = "test/tiny-clip"
ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


@pytest.mark.parametrize("data", [b"", b"\x00", b"not an image at all"], ids=["empty", "one byte", "text"])
def test_unreadable_image_bytes_are_invalid_image_without_a_heap_address(stub, data) -> None:
    request = inference_pb2.EncodeRequest(model=CLIP, items=[types_pb2.Item(id="pic", images=[types_pb2.Image(data=data)])])
    with pytest.raises(grpc.RpcError) as caught:
        stub.Encode(request, timeout=60)
    message = caught.value.details()
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(caught.value).reason == "INVALID_IMAGE"
    assert f"items[0] (id 'pic'): images[0]: not a JPEG, PNG or WebP image ({len(data)} bytes that do not decode" in message
    assert not ADDRESS.search(message) and "BytesIO" not in message, message
