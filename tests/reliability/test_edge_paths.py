"""Every spelling of a contract path is checked as the path itself: a trailing slash, duplicate slashes, `%2F`,
dot segments; no route takes a query string; and nothing the check did not choose reaches a service.

Envoy runs alone (no gateway behind it): a request the check lets through is answered 503 UPSTREAM_UNAVAILABLE
by Envoy, one it refuses 400/404 by the check, so the status tells which happened."""

from __future__ import annotations

import json

import pytest
from edge_load import request, running_edge

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

UNKNOWN = {"items": [{"text": "x"}], "colour": "red"}


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("paths")) as running:
        yield running


def answer(edge, method: str, path: str, body: object = None, headers: dict | None = None) -> tuple[int, str, dict]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    status, _, got = request(edge.port, method, path, data, headers)
    parsed = json.loads(got)
    (info,) = parsed["details"]
    return status, info["reason"], info["metadata"]


@pytest.mark.parametrize(
    ("method", "path", "body", "reason"),
    [
        ("POST", "/v1/embeddings/", {"model": "m", "input": "x", "colour": 1}, "UNKNOWN_FIELD"),
        ("POST", "/v1/configs/models/", {"id": "x", "hf_id": "x/y", "colour": 1}, "UNKNOWN_FIELD"),
        ("POST", "/v1/encode/org/model/", UNKNOWN, "UNKNOWN_FIELD"),
        ("POST", "//v1//encode//org//model", UNKNOWN, "UNKNOWN_FIELD"),
        ("POST", "/v1/encode/org%2Fmodel", UNKNOWN, "UNKNOWN_FIELD"),
        ("POST", "/v1/encode/org%2fmodel/", UNKNOWN, "UNKNOWN_FIELD"),
        ("POST", "/v1/./encode/x/../org/model", UNKNOWN, "UNKNOWN_FIELD"),
        ("POST", "/v1/pools/aaa/renew/", {"name": "bbb"}, "FIELD_IN_PATH"),
        ("POST", "/v1/embeddings/", b'{"model": "m", "input": "x",}', "INVALID_JSON"),
        ("POST", "/v1/embeddings/", {"model": "m", "input": "x", "dimensions": "8", "user": ["u"]}, "WRONG_JSON_TYPE"),
        ("GET", "/v1/pools/aaa/?name=bbb", None, "QUERY_NOT_ALLOWED"),
        ("DELETE", "/v1/pools/aaa/?name=bbb", None, "QUERY_NOT_ALLOWED"),
        ("DELETE", "/v1/pools//aaa?name=bbb", None, "QUERY_NOT_ALLOWED"),
        ("POST", "/v1/encode/org/model/?dims=8", {"items": [{"text": "x"}]}, "QUERY_NOT_ALLOWED"),
        ("GET", "/v1/configs/models/?model=x", None, "QUERY_NOT_ALLOWED"),
    ],
)
def test_another_spelling_of_a_route_gets_the_same_check(edge, method, path, body, reason) -> None:
    # A config write without an authorization header is answered 401 before its body is read; any token gets the
    # body checked at the edge (only the config service knows the right one).
    headers = {"authorization": "Bearer any"} if "/configs/" in path else None
    assert answer(edge, method, path, body, headers)[:2] == (400, reason)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/sie.v1.Inference/Encode", {"model": "m", "items": [{"text": "x"}], "colour": 1}),
        ("POST", "/sie.v1.ConfigService/AddModel", {"config": {"id": "x"}}),
        ("POST", "/v1/encode/", UNKNOWN),
        ("POST", "/v1/encode/../../etc/passwd", UNKNOWN),
        ("POST", "/v1/encode/..%2F..%2Fetc%2Fpasswd", UNKNOWN),
        ("GET", "/V1/models", None),
    ],
)
def test_a_path_no_route_takes_reaches_no_service(edge, method, path, body) -> None:
    """404 ROUTE_NOT_FOUND: not transcoded under another name, never forwarded (that would be a 503 here)."""
    assert answer(edge, method, path, body)[:2] == (404, "ROUTE_NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/encode/org/model/", {"items": [{"text": "x"}]}),
        ("POST", "/v1/encode/org%2Fmodel", {"items": [{"text": "x"}]}),
        ("POST", "/v1/embeddings/", {"model": "m", "input": "x"}),
        ("GET", "/v1/models/", None),
        ("DELETE", "/v1/pools/aaa/", None),
        ("POST", "/v1/pools/aaa/renew/", {}),
    ],
)
def test_a_well_formed_request_in_another_spelling_goes_on(edge, method, path, body) -> None:
    assert answer(edge, method, path, body)[:2] == (503, "UPSTREAM_UNAVAILABLE")


def test_a_method_a_path_does_not_take_is_405_in_every_spelling(edge) -> None:
    for path in ("/v1/pools/aaa", "/v1/pools/aaa/", "/v1//pools/aaa"):
        assert answer(edge, "PUT", path, None) == (405, "METHOD_NOT_ALLOWED", {"allow": "GET, DELETE"})


def test_an_overlong_path_is_refused_before_it_becomes_grpc_metadata(edge) -> None:
    """An 8 KB model id in the path was 429 RESOURCE_EXHAUSTED (the path travels as gRPC metadata): over 7 KiB of
    headers it is 431, under that but over 2048 bytes 414."""
    status, reason, metadata = answer(edge, "POST", "/v1/encode/" + "m" * 4096, {"items": [{"text": "x"}]})
    assert (status, reason, metadata) == (414, "PATH_TOO_LONG", {"limit": "2048"})
    assert answer(edge, "POST", "/v1/encode/" + "m" * 8192, {"items": [{"text": "x"}]})[:2] == (431, "HEADERS_TOO_LARGE")
    assert answer(edge, "POST", "/v1/encode/m", {"items": [{"text": "x"}]}, {"x-extra": "h" * 12_000})[:2] == (
        431,
        "HEADERS_TOO_LARGE",
    )
