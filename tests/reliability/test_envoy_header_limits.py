"""Headers past the edge's bound get a clean refusal, not a reset (issue 32: 9 KB of metadata on a native gRPC call
through Envoy was reset by its HTTP/2 codec, whose limit was the bound itself, and the caller heard INTERNAL). Envoy's
codecs now take up to 32 KiB, and the request check refuses headers over 7 KiB, counted as HTTP/2 and grpc count a
header list (name, value and 32 bytes each): 431 HEADERS_TOO_LARGE over HTTP/1 and HTTP/2, INVALID_ARGUMENT with the
same reason to a native gRPC call. (The gateway's own grpc refuses metadata past 8 KiB at random and past 16 KiB
always, with RESOURCE_EXHAUSTED: docs/security.md.) Envoy alone, its gateway unreachable (UNAVAILABLE: passed on)."""

from __future__ import annotations

import json
import subprocess

import grpc
import pytest
from edge_load import running_edge

from grpc_helpers import error_reason
from sie.v1 import inference_pb2

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

ENCODE = "/sie.v1.Inference/Encode"


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("header-limits")) as running:
        yield running


def native(port: int, metadata: tuple[tuple[str, str], ...]) -> grpc.RpcError:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as raised:
        channel.unary_unary(ENCODE)(inference_pb2.EncodeRequest(model="m").SerializeToString(), metadata=metadata)
    return raised.value


@pytest.mark.parametrize(
    "metadata",
    [(("x-big", "v" * 9000),), tuple((f"x-h{n}", "v" * 100) for n in range(60))],
    ids=["9 KB in one", "60 of 100 bytes"],
)
def test_too_much_metadata_on_a_native_call_is_invalid_argument(edge, metadata) -> None:
    error = native(edge.port, metadata)
    assert (error.code(), error_reason(error)) == (grpc.StatusCode.INVALID_ARGUMENT, "HEADERS_TOO_LARGE"), error
    assert "7 KiB" in error.details()
    # and just under the bound it goes on
    assert native(edge.port, (("x-big", "v" * 6000),)).code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("http2", [False, True], ids=["HTTP/1", "HTTP/2"])
def test_too_much_of_headers_over_http_is_a_json_431(edge, http2: bool) -> None:
    command = [
        "curl", "-s", "-w", "\n%{http_code}", "-H", "x-big: " + "v" * 9000, f"http://127.0.0.1:{edge.port}/v1/models",
    ]  # fmt: skip
    if http2:
        command.insert(1, "--http2-prior-knowledge")
    body, _, status = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.rpartition("\n")
    assert (status, json.loads(body)["details"][0]["reason"]) == ("431", "HEADERS_TOO_LARGE")
