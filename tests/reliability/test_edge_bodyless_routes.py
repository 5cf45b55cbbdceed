"""A route without a body (GET, DELETE) takes none through Envoy. The transcoder reads a body sent with one anyway, its
fields over the path's: `DELETE /v1/pools/aaa` with `{"name": "bbb"}` reached the gateway as DeletePool of `bbb`, and
`GET /v1/configs/models/x` with `{"model": "y"}` as GetModelConfig of `y`, unknown fields and non-strict JSON accepted
(issue 32, attack round 4: issue 4's trailing-slash and query-string overrides, by the body). The request check now ends
such a request at the body's first byte: 400 BODY_NOT_ALLOWED; one without a body goes on as before.

Envoy alone, in front of a gateway nobody serves: a request that passes gets 503 UPSTREAM_UNAVAILABLE."""

from __future__ import annotations

import json
import socket

import pytest
from edge_load import request, running_edge

from raw_http2 import Connection

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

PASSED = "UPSTREAM_UNAVAILABLE"


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("bodyless")) as running:
        yield running


def reason(body: bytes) -> str:
    return json.loads(body)["details"][0]["reason"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/pools/aaa", b'{"name": "bbb"}'),
        ("GET", "/v1/pools/aaa", b'{"name": "bbb", "zzz": 1}'),
        ("GET", "/v1/configs/models/x", b'{"model": "y"}'),
        ("GET", "/v1/models/x", b"{'model': 'y',}"),
        ("GET", "/v1/pools", b"{}"),
    ],
)
def test_a_body_on_a_route_without_one_is_refused(edge, method: str, path: str, body: bytes) -> None:
    status, _, answer = request(edge.port, method, path, body)
    assert (status, reason(answer)) == (400, "BODY_NOT_ALLOWED"), answer


def test_the_same_routes_without_a_body_go_on(edge) -> None:
    for method, path in [("DELETE", "/v1/pools/aaa"), ("GET", "/v1/pools/aaa"), ("GET", "/v1/configs/models/x")]:
        status, _, answer = request(edge.port, method, path)
        assert (status, reason(answer)) == (503, PASSED), (method, path, answer)
    status, _, answer = request(edge.port, "GET", "/v1/pools", b"")  # content-length: 0
    assert (status, reason(answer)) == (503, PASSED), answer


def test_a_chunked_or_http2_body_on_a_route_without_one_is_refused(edge) -> None:
    """No content-length to see it by: the first byte of the body ends the request."""
    with socket.create_connection(("127.0.0.1", edge.port), timeout=10) as sender:
        sender.sendall(
            b"DELETE /v1/pools/aaa HTTP/1.1\r\nhost: edge\r\ntransfer-encoding: chunked\r\n\r\n"
            b'f\r\n{"name": "bbb"}\r\n0\r\n\r\n'
        )
        head, _, answer = sender.recv(65536).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and reason(answer) == "BODY_NOT_ALLOWED"
    with Connection(edge.port) as connection:
        with_body = connection.request("DELETE", "/v1/pools/aaa", [], b'{"name": "bbb"}')
        without = connection.request("DELETE", "/v1/pools/aaa", [])
        assert connection.read(lambda: connection.answered(with_body) and connection.answered(without), 10)
        assert reason(connection.bodies[with_body]) == "BODY_NOT_ALLOWED"
        assert reason(connection.bodies[without]) == PASSED
