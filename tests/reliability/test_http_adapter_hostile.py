"""Hostile bodies on each route of the gateway's HTTP adapter, through a real Envoy in front of a real gateway and
worker: malformed msgpack, deep nesting, huge maps, object dtypes, mismatched shapes, sizes, wrong types, unknown
fields and duplicate keys are answered 400 (413 for a size) in that protocol's error shape, quickly, and the stack
serves on."""

from __future__ import annotations

import json
import time

import httpx
import msgpack
import numpy as np
import pytest

from test_http_edge import MEAN, NER, RERANKER, running_edge

SDK = {"x-sie-sdk-version": "0.10.1", "content-type": "application/msgpack", "accept": "application/msgpack"}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def edge(tmp_path_factory, etcd_server, tiny_models):
    with running_edge(tmp_path_factory.mktemp("adapter-hostile"), etcd_server.endpoint, tiny_models) as running:
        yield running


def post(edge, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    started = time.monotonic()
    response = httpx.post(edge.base + path, content=body, headers=headers, timeout=30)
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


@pytest.mark.parametrize("case", sorted(REFERENCE_CASES))
def test_reference_wire_refuses_hostile_msgpack(edge, case) -> None:
    body, reason = REFERENCE_CASES[case]
    response = post(edge, f"/v1/encode/{MEAN}", body, SDK)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == reason and response.headers["x-sie-error-code"] == reason, error
    assert error["message"]


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
}


@pytest.mark.parametrize("case", sorted(JSON_CASES))
@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_rerank_refuses_hostile_json_in_cohere_shape(edge, case, path) -> None:
    body, reason = JSON_CASES[case]
    response = post(edge, path, body.replace(b'"m"', json.dumps(RERANKER).encode(), 1), JSON)
    assert response.status_code == 400, response.text
    assert response.json()["reason"] == reason and response.json()["message"], response.json()


TEI_CASES = {
    "not JSON": (b"{inputs: 1}", "Validation"),
    "duplicate keys": (b'{"inputs": "a", "inputs": "b"}', "Validation"),
    "deep nesting": (b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}", "Validation"),
    "unknown field": (b'{"inputs": "a", "colour": 1}', "Validation"),
    "wrong type": (b'{"inputs": 7}', "Validation"),
    "an empty list": (b'{"inputs": []}', "Validation"),
    "truncation from the left": (b'{"inputs": "a", "truncation_direction": "Left"}', "Validation"),
}


@pytest.mark.parametrize("case", sorted(TEI_CASES))
def test_tei_refuses_hostile_json_in_tei_shape(edge, case) -> None:
    body, kind = TEI_CASES[case]
    response = post(edge, f"/tei/{MEAN}/embed", body, JSON)
    assert response.status_code == 400, response.text
    assert set(response.json()) == {"error", "error_type"} and response.json()["error_type"] == kind


def test_sizes_and_queries(edge) -> None:
    huge = post(edge, f"/tei/{MEAN}/embed", b'{"inputs": "' + b"x" * (17 * 2**20) + b'"}', JSON)
    assert huge.status_code == 413
    query = httpx.get(f"{edge.base}/v1/models?limit=5", timeout=30)
    assert query.status_code == 400 and query.json()["details"][0]["reason"] == "QUERY_NOT_ALLOWED"
    items = httpx.post(f"{edge.base}/v1/encode/{MEAN}", json={"items": "hello"}, timeout=30)
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
    assert httpx.post(f"{edge.base}/v1/encode/{MEAN}", json={"items": [{"text": "x"}]}, timeout=30).status_code == 200
