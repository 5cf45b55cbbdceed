"""A malformed `grpc-timeout` header gets a clean refusal at the edge (issue 32: through Envoy it reached the gateway,
whose grpc reset the stream, and the caller heard INTERNAL). Envoy's request check refuses a value that is not gRPC's
TimeoutValue TimeoutUnit (1 to 8 digits and one of H M S m u n) before it goes on: a native gRPC call gets
INVALID_ARGUMENT with ErrorInfo INVALID_TIMEOUT, an HTTP request (the transcoder would pass the header on too) the JSON
400. Envoy alone (its gateway unreachable: a call that passes gets UNAVAILABLE); curl, since grpc clients will not send
a malformed timeout."""

from __future__ import annotations

import base64
import json
import subprocess

import pytest
from edge_load import running_edge
from google.rpc import error_details_pb2, status_pb2

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("grpc-timeout")) as running:
        yield running


def native_call(port: int, timeout: str) -> dict[str, str]:
    """The response headers (trailers-only answers carry the status there) of a native Encode call over HTTP/2, its
    request headers only (a body would race the answer Envoy gives at the headers)."""
    command = [
        "curl", "-s", "--http2-prior-knowledge", "-X", "POST", "-D", "-", "-o", "/dev/null",
        "-H", "content-type: application/grpc", "-H", "te: trailers", "-H", f"grpc-timeout: {timeout}",
        f"http://127.0.0.1:{port}/sie.v1.Inference/Encode",
    ]  # fmt: skip
    lines = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
    return {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}


@pytest.mark.parametrize("timeout", ["1x", "123456789S", "-1S", "10 S", "S", "1.5S", "9" * 300 + "m"])
def test_a_malformed_grpc_timeout_is_invalid_argument_to_a_native_caller(edge, timeout: str) -> None:
    headers = native_call(edge.port, timeout)
    assert headers["grpc-status"] == "3", headers
    status = status_pb2.Status.FromString(base64.b64decode(headers["grpc-status-details-bin"] + "=="))
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info) and info.reason == "INVALID_TIMEOUT"
    assert "grpc-timeout" in headers["grpc-message"]


@pytest.mark.parametrize("timeout", ["100m", "1S", "99999999n", "5H"])
def test_a_well_formed_grpc_timeout_goes_on(edge, timeout: str) -> None:
    assert native_call(edge.port, timeout)["grpc-status"] == "14"  # to the gateway nobody serves


def test_a_malformed_grpc_timeout_on_an_http_request_is_a_json_400(edge) -> None:
    command = [
        "curl", "-s", "-w", "\n%{http_code}", "-H", "content-type: application/json", "-H", "grpc-timeout: soon",
        "-d", '{"items": []}', f"http://127.0.0.1:{edge.port}/v1/encode/m",
    ]  # fmt: skip
    body, _, status = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.rpartition("\n")
    assert (status, json.loads(body)["details"][0]["reason"]) == ("400", "INVALID_TIMEOUT")
