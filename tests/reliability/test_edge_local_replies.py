"""Envoy's own answers carry the JSON error body every other error has (docs/http.md), with a reason: an
unreachable or killed gateway (it was 1.4 s of plain-text 503s), readiness, a body the transcoder cannot read, a
body over the limit, a request that does not arrive in time. Native gRPC callers keep a gRPC status."""

from __future__ import annotations

import json
import socket
import time

import grpc
import pytest
from edge_load import request, running_edge

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("local-replies")) as running:
        yield running


def json_error(body: bytes) -> tuple[int, str, dict]:
    parsed = json.loads(body)
    (info,) = parsed["details"]
    assert parsed["message"] and info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo" and info["domain"] == "sie"
    return parsed["code"], info["reason"], info["metadata"]


def test_an_unreachable_gateway_is_a_json_503_with_retry_after(edge) -> None:
    connection_headers = {}
    for method, path, body in [
        ("POST", "/v1/encode/m", b'{"items": [{"text": "x"}]}'),
        ("GET", "/v1/models", None),
        ("GET", "/v1/configs/epoch", None),
    ]:
        status, _, got = request(edge.port, method, path, body, connection_headers)
        code, reason, metadata = json_error(got)
        assert (status, code, reason) == (503, 14, "UPSTREAM_UNAVAILABLE"), got
        assert "remote_connection_failure" in metadata["envoy"] or "no_healthy_upstream" in metadata["envoy"]


def test_readiness_is_a_json_503_while_the_gateway_is_down(edge) -> None:
    status, _, got = request(edge.port, "GET", "/readyz")
    assert status == 503 and json_error(got)[:2] == (14, "NOT_READY")


def test_a_body_the_transcoder_cannot_read_is_a_json_400(edge) -> None:
    status, _, got = request(edge.port, "POST", "/v1/encode/m", b'{"items": [{"text": "x"}], "dims": "many"}')
    code, reason, metadata = json_error(got)
    assert (status, code, reason) == (400, 3, "INVALID_REQUEST")
    assert "dims" in json.loads(got)["message"] and metadata["envoy"].startswith("grpc_json_transcode_failure")


def test_a_body_over_the_limit_is_a_json_413_before_it_is_read(edge) -> None:
    head = (
        "POST /v1/encode/m HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\n"
        f"content-length: {17 * 2**20}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", edge.port), timeout=10) as sender:
        sender.sendall(head.encode())
        reply = sender.recv(65536).decode()
    status_line, _, body = reply.partition("\r\n\r\n")
    assert status_line.startswith("HTTP/1.1 413")
    assert json_error(body.encode())[1:] == ("BODY_TOO_LARGE", {"limit": str(16 * 2**20)})


def test_headers_that_do_not_arrive_in_time_are_a_json_408(edge) -> None:
    """Half a request's headers, then nothing: answered within the 10 s headers timeout (not the 300 s idle one)."""
    with socket.create_connection(("127.0.0.1", edge.port), timeout=30) as sender:
        sender.sendall(b"POST /v1/encode/m HTTP/1.1\r\nhost: edge\r\n")
        started = time.monotonic()
        reply = sender.recv(65536).decode()
        waited = time.monotonic() - started
    assert reply.startswith("HTTP/1.1 408"), reply
    assert 8 < waited < 20, waited
    assert json_error(reply.partition("\r\n\r\n")[2].encode())[1] == "REQUEST_TIMEOUT"


def test_native_grpc_keeps_a_grpc_status(edge) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{edge.port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Encode(inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(text="x")]), timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    assert not (raised.value.details() or "").startswith("{"), "a gRPC caller gets Envoy's text, not a JSON body"
