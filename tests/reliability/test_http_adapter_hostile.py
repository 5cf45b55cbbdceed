"""Hostile bodies on each route of the gateway's HTTP adapter, through a real Envoy in front of a real gateway and
worker: malformed msgpack, deep nesting, huge maps, object dtypes, mismatched shapes, sizes, wrong types, unknown
fields, duplicate keys, numbers too long, lone surrogates and wrong content types are answered 400 (413 for a size,
415 for a content type) in that protocol's error shape, quickly, on every route, and the stack serves on. The stack
requires a bearer token (SIE_AUTH_MODE=static): no route of the adapter answers without it."""

from __future__ import annotations

import json
import time

import httpx
import msgpack
import numpy as np
import pytest

from test_http_edge import MEAN, NER, RERANKER, SPLADE, running_edge

TOKEN = "hostile-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
SDK = {"x-sie-sdk-version": "0.10.1", "content-type": "application/msgpack", "accept": "application/msgpack", **AUTH}
JSON = {"content-type": "application/json", **AUTH}


STATIC_AUTH = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": TOKEN}


@pytest.fixture(scope="module")
def edge(tmp_path_factory, etcd_server, tiny_models):
    directory = tmp_path_factory.mktemp("adapter-hostile")
    with running_edge(directory, etcd_server.endpoint, tiny_models, **STATIC_AUTH) as running:
        yield running


def post(edge, path: str, body: bytes, headers: dict[str, str], method: str = "POST") -> httpx.Response:
    started = time.monotonic()
    response = httpx.request(method, edge.base + path, content=body, headers=headers, timeout=30)
    assert time.monotonic() - started < 10, path
    return response


def array(dtype: str, kind: bytes = b"", shape: list[int] | None = None, data: bytes = b"\x00" * 16) -> dict:
    return {b"nd": True, b"type": dtype, b"kind": kind, b"shape": shape if shape is not None else [4], b"data": data}


NESTED = {"a": 1}
for _ in range(40):
    NESTED = {"a": NESTED}

REFERENCE_CASES = {
    "malformed msgpack": (b"\xc1\xc1\xc1", "INVALID_MSGPACK"),
    "cut short": (msgpack.packb({"items": [{"text": "x"}]})[:-2], "INVALID_MSGPACK"),
    "deep nesting": (msgpack.packb({"items": [{"text": "x", "metadata": NESTED}]}), "TOO_DEEP"),
    "very deep nesting": (b"\x81\xa5items" + b"\x91" * 50000 + b"\xc0", "INVALID_MSGPACK"),
    "huge map announced": (b"\x81\xa5items\xdf\x7f\xff\xff\xff", "INVALID_MSGPACK"),
    "huge string announced": (b"\x81\xa5items\xdb\x7f\xff\xff\xff", "INVALID_MSGPACK"),
    "object dtype": (
        msgpack.packb({"items": [], "x": array("|O", b"O", data=b"\x80\x04cos\nsystem\n.")}),
        "ARRAY_DTYPE_REFUSED",
    ),
    "structured dtype": (msgpack.packb({"items": [], "x": array("|V16", b"V")}), "ARRAY_DTYPE_REFUSED"),
    "mismatched shape": (msgpack.packb({"items": [], "x": array("<f4", shape=[64])}), "ARRAY_SHAPE_MISMATCH"),
    "an array where an item goes": (
        msgpack.packb({"items": [array("<f4")]}, use_bin_type=True),
        "WRONG_TYPE",
    ),
    "items a string": (msgpack.packb({"items": "hello"}), "WRONG_TYPE"),
    "unknown field": (msgpack.packb({"items": [{"text": "x"}], "colour": 1}), "UNKNOWN_FIELD"),
    "unknown item field": (msgpack.packb({"items": [{"txt": "x"}]}), "UNKNOWN_FIELD"),
    "unknown param": (msgpack.packb({"items": [{"text": "x"}], "params": {"colour": 1}}), "UNKNOWN_FIELD"),
    "duplicate keys": (b"\x82\xa5items\x90\xa5items\x90", "DUPLICATE_FIELD"),
    "wrong param type": (msgpack.packb({"items": [{"text": "x"}], "params": {"is_query": "yes"}}), "WRONG_TYPE"),
    "too many items": (msgpack.packb({"items": [{"text": "x"}] * 8193}), "TOO_MANY_ITEMS"),
}


# Malformed whatever the route: encode, score and extract read their bodies alike.
BODY_CASES = {
    "malformed msgpack",
    "cut short",
    "very deep nesting",
    "huge map announced",
    "huge string announced",
    "object dtype",
    "mismatched shape",
    "duplicate keys",
    "ext type",
    "huge array announced",
}
REFERENCE_CASES |= {
    "ext type": (b"\x81\xa5items\x91\xc7\x01\x05a", "INVALID_MSGPACK"),  # msgpack extension type 5
    "huge array announced": (b"\x81\xa5items\xdd\x7f\xff\xff\xff", "INVALID_MSGPACK"),
}
# Each route with a body it serves.
REFERENCE_BODIES = {
    f"/v1/encode/{MEAN}": {"items": [{"text": "x"}]},
    f"/v1/score/{RERANKER}": {"query": {"text": "q"}, "items": [{"text": "x"}]},
    f"/v1/extract/{NER}": {"items": [{"text": "Ada"}]},
}
REFERENCE_ROUTES = list(REFERENCE_BODIES)


def reference_refusal(response: httpx.Response, reason: str, status: int = 400) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == reason and response.headers["x-sie-error-code"] == reason, error
    assert error["message"]


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_reference_wire_refuses_hostile_msgpack(edge, case) -> None:
    body, reason = REFERENCE_CASES[case]
    routes = REFERENCE_ROUTES if case in BODY_CASES else REFERENCE_ROUTES[:1]
    for route in routes:
        reference_refusal(post(edge, route, body, SDK), reason)


def test_reference_wire_refuses_unknown_fields_other_content_types_and_bad_json(edge) -> None:
    sdk_json = {**SDK, "content-type": "application/json"}
    for route, fields in REFERENCE_BODIES.items():
        reference_refusal(post(edge, route, msgpack.packb({**fields, "colour": 1}), SDK), "UNKNOWN_FIELD")
        plain = post(edge, route, msgpack.packb({"items": [{"text": "x"}]}), {**SDK, "content-type": "text/plain"})
        reference_refusal(plain, "UNSUPPORTED_MEDIA_TYPE", 415)
        reference_refusal(post(edge, route, b'{"items": [], "x": ' + b"9" * 5000 + b"}", sdk_json), "INVALID_JSON")
        reference_refusal(post(edge, route, b'{"items": [{"text": "\\ud800"}]}', sdk_json), "INVALID_JSON")
        reference_refusal(post(edge, route, b'{"items": [], "items": []}', sdk_json), "DUPLICATE_FIELD")
    pool = post(edge, "/v1/pools", msgpack.packb({"name": "p"}), {**SDK, "content-type": "application/msgpack"})
    reference_refusal(pool, "UNSUPPORTED_MEDIA_TYPE", 415)
    reference_refusal(post(edge, "/v1/pools", b'{"name": "p", "name": "q"}', sdk_json), "DUPLICATE_FIELD")


def test_reference_wire_object_dtype_never_unpickles(edge, tmp_path) -> None:
    marker = tmp_path / "pwned"
    payload = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."
    response = post(edge, f"/v1/score/{RERANKER}", msgpack.packb({"query": array("|O", b"O", data=payload)}), SDK)
    assert response.status_code == 400 and response.json()["error"]["code"] == "ARRAY_DTYPE_REFUSED"
    assert not marker.exists()


JSON_CASES = {
    "not JSON": (b"{'model': 1}", "INVALID_JSON"),
    "NaN": (b'{"model": "m", "query": "q", "documents": ["a"], "top_n": NaN}', "INVALID_JSON"),
    "duplicate keys": (b'{"model": "m", "model": "n", "query": "q", "documents": ["a"]}', "DUPLICATE_FIELD"),
    "deep nesting": (b'{"model": "m", "query": "q", "documents": ' + b"[" * 5000 + b"]" * 5000 + b"}", "TOO_DEEP"),
    "unknown field": (b'{"model": "m", "query": "q", "documents": ["a"], "colour": 1}', "UNKNOWN_FIELD"),
    "wrong type": (b'{"model": "m", "query": "q", "documents": "a"}', "WRONG_TYPE"),
    "missing field": (b'{"model": "m", "documents": ["a"]}', "MISSING_FIELD"),
    "huge object": (json.dumps({str(i): i for i in range(20000)}).encode(), "CONTAINER_TOO_LONG"),
    "number too long": (
        b'{"model": "m", "query": "q", "documents": ["a"], "top_n": ' + b"9" * 5000 + b"}",
        "INVALID_JSON",
    ),
    "lone surrogate": (b'{"model": "m", "query": "\\ud800", "documents": ["a"]}', "INVALID_JSON"),
    "an array body": (b'["m"]', "WRONG_TYPE"),
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_rerank_refuses_hostile_json_in_cohere_shape(edge, case, path) -> None:
    body, reason = JSON_CASES[case]
    response = post(edge, path, body.replace(b'"m"', json.dumps(RERANKER).encode(), 1), JSON)
    assert response.status_code == 400, response.text
    assert response.json()["reason"] == reason and response.json()["message"], response.json()


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_rerank_refuses_other_content_types_in_cohere_shape(edge, path) -> None:
    body = json.dumps({"model": RERANKER, "query": "q", "documents": ["a"]}).encode()
    for headers in (
        {**AUTH, "content-type": "text/plain"},
        {**AUTH, "content-type": "application/x-www-form-urlencoded"},
        AUTH,
        {**SDK, "content-type": "application/msgpack"},
    ):
        response = post(edge, path, body, headers)
        assert response.status_code == 415, (headers, response.text)
        assert (
            response.json()["reason"] == "UNSUPPORTED_MEDIA_TYPE" and "application/json" in response.json()["message"]
        )
    assert post(edge, path, body, {**JSON, "content-type": "application/json; charset=utf-8"}).status_code == 200


TEI_CASES = {
    "not JSON": (b"{inputs: 1}", "Validation"),
    "duplicate keys": (b'{"inputs": "a", "inputs": "b"}', "Validation"),
    "deep nesting": (b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", "Validation"),
    "unknown field": (b'{"inputs": "a", "colour": 1}', "Validation"),
    "wrong type": (b'{"inputs": 7}', "Validation"),
    "an empty list": (b'{"inputs": []}', "Validation"),
    "truncation from the left": (b'{"inputs": "a", "truncation_direction": "Left"}', "Validation"),
    "number too long": (b'{"inputs": "a", "truncate": ' + b"9" * 5000 + b"}", "Validation"),
    "lone surrogate": (b'{"inputs": "\\udc00x"}', "Validation"),
    "an array body": (b'["a"]', "Validation"),
}
# Every TEI route that reads a body (POST / describes the model first, then reads it as /embed's).
TEI_ROUTES = [f"/tei/{MEAN}/embed", f"/tei/{SPLADE}/embed_sparse", f"/tei/{MEAN}/embed_all", f"/tei/{RERANKER}/rerank"]


@pytest.mark.parametrize("case", sorted(TEI_CASES))
def test_tei_refuses_hostile_json_in_tei_shape(edge, case) -> None:
    body, kind = TEI_CASES[case]
    for route in [*TEI_ROUTES, f"/tei/{MEAN}"]:
        response = post(edge, route, body, JSON)
        assert response.status_code == 400, (route, response.text)
        assert set(response.json()) == {"error", "error_type"} and response.json()["error_type"] == kind


def test_tei_refuses_other_content_types_in_tei_shape(edge) -> None:
    for route in TEI_ROUTES:
        for headers in ({**AUTH, "content-type": "text/plain"}, AUTH, {**AUTH, "content-type": "application/msgpack"}):
            response = post(edge, route, msgpack.packb({"inputs": "a"}), headers)
            assert response.status_code == 415, (route, headers, response.text)
            assert response.json()["error_type"] == "Validation" and "application/json" in response.json()["error"]
    too_many = post(edge, f"/tei/{MEAN}/embed", json.dumps({"inputs": ["a"] * 8193}).encode(), JSON)
    assert too_many.status_code == 413 and too_many.json()["error_type"] == "Validation", too_many.text


# Each route of the adapter, with a body it would serve, asked without a token and with a wrong one.
ROUTES = [
    ("POST", "/v1/rerank", b'{"model": "test/tiny-reranker", "query": "q", "documents": ["a"]}', JSON, "cohere"),
    ("POST", "/v2/rerank", b'{"model": "test/tiny-reranker", "query": "q", "documents": ["a"]}', JSON, "cohere"),
    ("POST", f"/tei/{MEAN}/embed", b'{"inputs": "a"}', JSON, "tei"),
    ("POST", f"/tei/{MEAN}", b'{"inputs": "a"}', JSON, "tei"),
    ("POST", f"/tei/{RERANKER}/rerank", b'{"query": "q", "texts": ["a"]}', JSON, "tei"),
    ("GET", f"/tei/{MEAN}/info", b"", AUTH, "tei"),
    ("GET", f"/tei/{MEAN}/health", b"", AUTH, "tei"),
    ("GET", "/v1/models", b"", AUTH, "google"),
    ("GET", f"/v1/models/{MEAN}", b"", AUTH, "google"),
    ("POST", f"/v1/encode/{MEAN}", msgpack.packb({"items": [{"text": "a"}]}), SDK, "reference"),
    (
        "POST",
        f"/v1/score/{RERANKER}",
        msgpack.packb({"query": {"text": "q"}, "items": [{"text": "a"}]}),
        SDK,
        "reference",
    ),
    ("POST", f"/v1/extract/{NER}", msgpack.packb({"items": [{"text": "Ada"}]}), SDK, "reference"),
    ("GET", f"/v1/models/{MEAN}", b"", SDK, "reference"),
    ("GET", "/health", b"", SDK, "reference"),
    ("GET", "/v1/pools/p", b"", SDK, "reference"),
]


def reason_of(response: httpx.Response, shape: str) -> str:
    body = response.json()
    if shape == "cohere":
        return body["reason"]
    if shape == "tei":
        assert set(body) == {"error", "error_type"}, body
        return "MISSING_TOKEN" if "authorization" in body["error"] else body["error"]
    if shape == "google":
        return body["details"][0]["reason"]
    return body["error"]["code"]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "shape"), ROUTES, ids=[f"{m} {p}" for m, p, *_ in ROUTES]
)
def test_no_route_answers_without_a_token(edge, method, path, body, headers, shape) -> None:
    anonymous = {name: value for name, value in headers.items() if name != "authorization"}
    missing = post(edge, path, body, anonymous, method)
    assert missing.status_code == 401 and reason_of(missing, shape) == "MISSING_TOKEN", missing.text
    wrong = post(edge, path, body, {**anonymous, "authorization": "Bearer not-the-token"}, method)
    assert wrong.status_code in (401, 403), wrong.text
    if path != "/v1/pools/p":  # no such pool: 404 with the token
        assert post(edge, path, body, headers, method).status_code == 200


def test_sizes_and_queries(edge) -> None:
    huge = b'{"inputs": "' + b"x" * (17 * 2**20) + b'"}'
    for path, headers in ((f"/tei/{MEAN}/embed", JSON), ("/v1/rerank", JSON), (f"/v1/encode/{MEAN}", SDK)):
        assert post(edge, path, huge, headers).status_code == 413, path
        # Without a content-length (chunked), Envoy cannot refuse it up front: the adapter stops reading at the limit.
        chunks = (huge[start : start + 2**20] for start in range(0, len(huge), 2**20))
        chunked = httpx.post(edge.base + path, content=chunks, headers=headers, timeout=30)
        assert chunked.status_code == 413, (path, chunked.text)
    query = httpx.get(f"{edge.base}/v1/models?limit=5", headers=AUTH, timeout=30)
    assert query.status_code == 400 and query.json()["details"][0]["reason"] == "QUERY_NOT_ALLOWED"
    items = httpx.post(f"{edge.base}/v1/encode/{MEAN}", json={"items": "hello"}, headers=AUTH, timeout=30)
    assert items.status_code == 400 and items.headers["content-type"].startswith("application/json")
    assert items.json()["details"][0]["reason"] == "WRONG_JSON_TYPE"


def test_the_stack_serves_after_the_hostile_requests(edge) -> None:
    ok = post(edge, f"/v1/encode/{MEAN}", msgpack.packb({"items": [{"text": "still here"}]}), SDK)
    assert ok.status_code == 200, ok.text
    answer = msgpack.unpackb(ok.content, raw=False, strict_map_key=False)
    dense = answer["items"][0]["dense"]["values"]
    vector = np.frombuffer(dense[b"data"], dtype=dense[b"type"]).reshape(dense[b"shape"])
    assert vector.shape == (32,)
    extract = post(edge, f"/v1/extract/{NER}", msgpack.packb({"items": [{"text": "Ada in London"}]}), SDK)
    assert extract.status_code == 200, extract.text
    ours = httpx.post(f"{edge.base}/v1/encode/{MEAN}", json={"items": [{"text": "x"}]}, headers=AUTH, timeout=30)
    assert ours.status_code == 200
