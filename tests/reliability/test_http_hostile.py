"""Through Envoy (HTTP/JSON) with static tokens on the gateway and an admin token on the config service:
every protected route refuses a request without a valid token (401/403 with a JSON body), and hostile
HTTP requests get their expected status while the stack keeps serving correct answers."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from edge_helpers import ADMIN_TOKEN, AUTH_TOKEN as TOKEN, MEAN, NER, RERANKER, Edge, curl

AUTH = {"authorization": f"Bearer {TOKEN}"}
ITEMS = {"items": [{"text": "x"}]}

# method, path, body: every route the gateway or the config service protects.
PROTECTED = [
    ("POST", f"/v1/encode/{MEAN}", ITEMS),
    ("POST", f"/v1/score/{RERANKER}", {"query": {"text": "q"}, **ITEMS}),
    ("POST", f"/v1/extract/{NER}", ITEMS),
    ("POST", "/v1/embeddings", {"model": MEAN, "input": "x"}),
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MEAN}", None),
    ("POST", "/v1/pools", {"name": "p", "gpus": {"default": 1}}),
    ("GET", "/v1/pools", None),
    ("GET", "/v1/pools/p", None),
    ("POST", "/v1/pools/p/renew", {}),
    ("DELETE", "/v1/pools/p", None),
    # The body of POST /v1/configs/models is the ModelConfig itself (body: "config").
    ("POST", "/v1/configs/models", {"id": "x/never", "hf_id": "x/y", "profiles": {"default": {"adapter": "sentence_transformer"}}}),
    ("GET", "/v1/configs/export", None),
]


KNOWN = {"items": [{"text": "still serving after hostile input"}]}


@pytest.fixture(scope="module")
def reference(auth_edge) -> list[float]:
    status, body = curl(auth_edge, "POST", f"/v1/encode/{MEAN}", KNOWN, AUTH)
    assert status == 200, body
    return body["results"][0]["dense"]["values"]


def reason(body: dict) -> str | None:
    infos = [detail for detail in body.get("details", []) if detail.get("@type", "").endswith("google.rpc.ErrorInfo")]
    return infos[0]["reason"] if infos else None


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED, ids=[f"{m} {p}" for m, p, _ in PROTECTED])
def test_protected_routes_refuse_missing_and_wrong_tokens(auth_edge, method, path, body, reliability_report) -> None:
    for presented, headers, status, expected_reason in [
        ("no token", {}, 401, "MISSING_TOKEN"),
        ("wrong token", {"authorization": "Bearer not-the-token"}, 403, "INVALID_TOKEN"),
    ]:
        got_status, got = curl(auth_edge, method, path, body, headers)
        reliability_report.add("security", f"Envoy {method} {path}, {presented}", expected=status, actual=got_status)
        assert got_status == status, got
        assert got["message"] and reason(got) == expected_reason
    # The right token opens it (a pool route may answer NOT_FOUND for the pool, never 401/403).
    token = {"authorization": f"Bearer {ADMIN_TOKEN}"} if path.startswith("/v1/configs") else AUTH
    assert curl(auth_edge, method, path, body, token)[0] not in (401, 403)


def curl_bytes(edge: Edge, path: str, body: bytes, *extra: str) -> tuple[int, str]:
    """POST raw bytes (curl --data-binary), paths as they are (no client-side normalisation)."""
    command = ["curl", "-s", "--path-as-is", "-X", "POST", "-w", "\n%{http_code}", "-H", "content-type: application/json",
               "-H", f"authorization: {AUTH['authorization']}", "--data-binary", "@-", *extra, edge.base + path]
    output = subprocess.run(command, input=body, capture_output=True, timeout=60, check=True).stdout.decode(errors="replace")
    text, _, status = output.rpartition("\n")
    return int(status), text


HOSTILE = [
    # name, path, body, expected HTTP status (or the statuses that may answer it)
    ("empty batch", f"/v1/encode/{MEAN}", json.dumps({"items": []}).encode(), 400),
    ("invalid UTF-8 in a text", f"/v1/encode/{MEAN}", b'{"items": [{"text": "\xff\xfe bad"}]}', 400),
    ("items is a string", f"/v1/encode/{MEAN}", json.dumps({"items": "not a list"}).encode(), 400),
    ("dims is a string", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "dims": "many"}).encode(), 400),
    ("text is a number", f"/v1/encode/{MEAN}", json.dumps({"items": [{"text": 42}]}).encode(), 400),
    ("body is a JSON array", f"/v1/encode/{MEAN}", b"[1, 2, 3]", 400),
    ("body is not JSON", f"/v1/encode/{MEAN}", b"{items: nope", 400),
    ("negative dims", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "dims": -5}).encode(), 400),
    ("unknown output dtype", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "output_dtype": "float64"}).encode(), 400),
    ("unknown LoRA", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "lora": "../../etc/passwd"}).encode(), 400),
    ("unknown model", "/v1/encode/nobody/nothing", json.dumps(ITEMS).encode(), 404),
    ("model id with path traversal", "/v1/encode/../../etc/passwd", json.dumps(ITEMS).encode(), 404),
    ("model id with encoded path traversal", "/v1/encode/..%2F..%2Fetc%2Fpasswd", json.dumps(ITEMS).encode(), 404),
    ("absolute path as model id", "/v1/encode//etc/passwd", json.dumps(ITEMS).encode(), 404),
    ("unknown field", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "params": {"colour": 1}}).encode(), 400),
    ("unknown field after deep options", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "options": {"a": [[[[1]]]]}, "colour": 1}).encode(), 400),
    ("a parameter given twice differently", f"/v1/encode/{MEAN}", json.dumps({**ITEMS, "is_query": True, "options": {"is_query": False}}).encode(), 400),
    ("megabyte text", f"/v1/encode/{MEAN}", json.dumps({"items": [{"text": "word " * 200_000}]}).encode(), 200),
    # Refused either by Envoy's transcoder, when flow control leaves it buffering more than its limit
    # (413), or by the gateway's SIE_MAX_RECEIVE_MESSAGE_BYTES (RESOURCE_EXHAUSTED: 429); which one
    # depends on how fast the gateway reads.
    ("oversize body (17 MiB)", f"/v1/encode/{MEAN}", json.dumps({"items": [{"text": "x" * (17 * 2**20)}]}).encode(), (413, 429)),
]


@pytest.mark.parametrize(("name", "path", "body", "status"), HOSTILE, ids=[case[0] for case in HOSTILE])
def test_hostile_http_request_gets_its_status_and_the_stack_keeps_serving(auth_edge, reference, name, path, body, status, reliability_report) -> None:
    got_status, text = curl_bytes(auth_edge, path, body)
    reliability_report.add("hostile input", f"HTTP via Envoy: {name}", expected=status, actual=got_status)
    assert got_status in (status if isinstance(status, tuple) else (status,)), text[:500]
    # ...and a known request still gets the same answer.
    again_status, again = curl(auth_edge, "POST", f"/v1/encode/{MEAN}", KNOWN, AUTH)
    assert again_status == 200, again
    np.testing.assert_array_equal(again["results"][0]["dense"]["values"], reference)
