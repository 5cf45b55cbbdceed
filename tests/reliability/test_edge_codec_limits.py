"""What Envoy's HTTP codecs refuse before any filter or route runs, and what each caller gets. Over HTTP/1 more than 100
request headers, or more than 7 KiB of them, is a 431 with the JSON error body (the local-reply mappers shape it);
over HTTP/2 the codec resets that stream (RST_STREAM) before any filter or local reply can run, so no JSON answer is
possible: what is guaranteed is that only that stream ends, the connection serves its other streams and other callers
see nothing (issue 32, found as "101 small headers over HTTP/2 get a reset, not the 431"). A request target that is no
path (`OPTIONS *`) was an empty 404; it is the JSON ROUTE_NOT_FOUND every other unknown route gets."""

from __future__ import annotations

import json
import socket

import grpc
import pytest
from edge_load import request, running_edge

from raw_http2 import Connection
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

JSON = [("content-type", "application/json")]
BODY = b'{"items": [{"text": "x"}]}'
PASSED = "UPSTREAM_UNAVAILABLE"  # checked and passed on, to the gateway nobody serves
MANY = [(f"x-h{number}", "1") for number in range(101)]
LONG = [(f"x-long{number}", "v" * 1000) for number in range(8)]


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("codec-limits")) as running:
        yield running


def error(body: bytes) -> tuple[str, dict]:
    (info,) = json.loads(body)["details"]
    return info["reason"], info["metadata"]


def raw(port: int, head: bytes) -> tuple[bytes, bytes]:
    """The status line and body of the answer to one raw HTTP/1 request."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sender:
        sender.sendall(head)
        reply = sender.makefile("rb")
        status = reply.readline().rstrip()
        length = 0
        while (line := reply.readline().rstrip()) != b"":
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, reply.read(length)


@pytest.mark.parametrize("headers", [MANY, LONG], ids=["101 headers", "8 KiB of headers"])
def test_too_many_headers_over_http1_are_a_json_431(edge, headers) -> None:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    status, body = raw(edge.port, f"GET /v1/models HTTP/1.1\r\nhost: edge\r\n{lines}\r\n".encode())
    reason, metadata = error(body)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large" and reason == "HEADERS_TOO_LARGE"
    # the codec's (101 fields), or the request check's (8 KiB: the codec takes 32, test_envoy_header_limits)
    assert metadata.get("envoy", "http1.too_many_headers") == "http1.too_many_headers"
    assert "100 fields or 7 KiB" in json.loads(body)["message"]


@pytest.mark.parametrize("headers", [MANY], ids=["101 headers"])
def test_too_many_headers_over_http2_reset_that_stream_only(edge, headers) -> None:
    with Connection(edge.port) as connection, Connection(edge.port, source="127.0.0.2") as other:
        before = connection.request("POST", "/v1/encode/m", JSON, BODY)
        refused = connection.request("POST", "/v1/encode/m", [*JSON, *headers], BODY)
        after = connection.request("POST", "/v1/encode/m", JSON, BODY)
        elsewhere = other.request("POST", "/v1/encode/m", JSON, BODY)
        assert connection.read(lambda: all(connection.answered(stream) for stream in (before, refused, after)), 10)
        assert other.read(lambda: other.answered(elsewhere), 10)
        assert refused in connection.resets and refused not in connection.bodies  # the codec's: no answer to shape
        assert [error(connection.bodies[stream])[0] for stream in (before, after)] == [PASSED, PASSED]
        assert error(other.bodies[elsewhere])[0] == PASSED and connection.goaway is None
    assert error(request(edge.port, "POST", "/v1/encode/m", BODY)[2])[0] == PASSED  # and over HTTP/1


def test_too_much_metadata_on_a_native_grpc_call_fails_that_call_only(edge) -> None:
    """A gRPC client hears of the reset as a failed call; its channel (one HTTP/2 connection) goes on."""
    item = types_pb2.Item(text="x")
    with grpc.insecure_channel(f"127.0.0.1:{edge.port}") as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        calls = []
        for metadata in ((), tuple(MANY), ()):
            with pytest.raises(grpc.RpcError) as raised:
                stub.Encode(inference_pb2.EncodeRequest(model="m", items=[item]), metadata=metadata, timeout=10)
            calls.append(raised.value.code())
    # the others reach Envoy's router: no gateway behind it (UNAVAILABLE)
    assert calls[0] == calls[2] == grpc.StatusCode.UNAVAILABLE
    assert calls[1] == grpc.StatusCode.INTERNAL, calls  # "Received RST_STREAM with error code 2"


def test_a_target_that_is_no_path_is_a_json_404(edge) -> None:
    status, body = raw(edge.port, b"OPTIONS * HTTP/1.1\r\nhost: edge\r\n\r\n")
    reason, metadata = error(body)
    assert (status, reason) == (b"HTTP/1.1 404 Not Found", "ROUTE_NOT_FOUND"), body
    assert metadata["envoy"] == "absolute_path_rejected"
    # `*` is a target only OPTIONS takes: with any other method the codec refuses the request line
    status, body = raw(edge.port, b"GET * HTTP/1.1\r\nhost: edge\r\n\r\n")
    assert (status, error(body)[0]) == (b"HTTP/1.1 400 Bad Request", "INVALID_REQUEST")


@pytest.mark.parametrize(
    "malformed", [("X-Upper", "1"), ("connection", "close"), ("te", "gzip")], ids=["uppercase", "connection", "te"]
)
def test_a_malformed_header_over_http2_resets_that_stream_only(edge, malformed) -> None:
    """HTTP/2 forbids upper-case names and connection-specific headers; one stream sending one used to end the whole
    connection, a shared gRPC channel's calls in flight with it (an outside attack: the earlier stream's body, sent
    after, got no answer)."""
    with Connection(edge.port) as connection:
        before = connection.request("POST", "/v1/encode/m", JSON, end=False)  # its body still to come
        refused = connection.request("POST", "/v1/encode/m", [*JSON, malformed], BODY)
        connection.send(before, BODY, end=True)
        assert connection.read(lambda: all(connection.answered(stream) for stream in (before, refused)), 10)
        assert refused in connection.resets and connection.goaway is None
        assert error(connection.bodies[before])[0] == PASSED
