"""The edge fuzzer: generated bodies, paths and headers against a real Envoy in front of a real gateway and worker.

Every request is answered within a time linear in its size; never 200 for a body the contract refuses (judged by
protobuf's own JSON parser on the strictly parsed body, with the edge's documented limits); never a 5xx but for a
documented cause; every refusal is the JSON error body. The corpus (edge_corpus.json) replays every HTTP-edge defect
found so far, each with the status and reason it must get now. 1,000 generated requests: about 20 s on 2 cores.
Every request here is refused or reads, so the suite's shared `edge` serves them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from edge_load import request
from google.protobuf import json_format
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_http_edge import CLIP, MEAN

from sie.v1 import inference_pb2

CORPUS = Path(__file__).with_name("edge_corpus.json")
# 5xx reasons docs/http.md documents (a live stack with a loaded model should give none of them here).
DOCUMENTED_5XX = {"UPSTREAM_UNAVAILABLE", "OVERLOADED", "PROVISIONING", "MODEL_LOADING", "NOT_READY"}
# The edge's own JSON limits (docs/http.md): deeper, more values or longer numbers are refused whatever the schema.
MAX_DEPTH, MAX_VALUES, MAX_NUMBER = 64, 65536, 64


def port_of(edge) -> int:
    return int(edge.base.rsplit(":", 1)[1])


def time_bound(size: int) -> float:
    """Generous for 2 busy cores: the check and the transcoder take tens of ms per MB."""
    return 3.0 + size / 2**20


def assert_json_error(status: int, body: bytes) -> dict:
    parsed = json.loads(body)
    assert isinstance(parsed.get("code"), int) and parsed.get("message"), parsed
    (info,) = [d for d in parsed["details"] if d["@type"].endswith("google.rpc.ErrorInfo")]
    assert info["domain"] == "sie" and info["reason"], parsed
    if status >= 500:
        assert info["reason"] in DOCUMENTED_5XX, parsed
    return info


# --- the corpus -----------------------------------------------------------------------------------------------


def expand(spec: Any) -> str:
    parts = spec if isinstance(spec, list) else [spec]
    text = "".join(part if isinstance(part, str) else part[0] * part[1] for part in parts)
    return text.replace("{mean}", MEAN).replace("{clip}", CLIP)


ENTRIES = json.loads(CORPUS.read_text())["requests"]


@pytest.mark.parametrize("entry", ENTRIES, ids=[entry["name"] for entry in ENTRIES])
def test_every_known_edge_defect_stays_fixed(edge, entry) -> None:
    body = expand(entry["body"]).encode() if "body" in entry else None
    headers = {name: expand(value) for name, value in entry.get("headers", {}).items()}
    status, seconds, got = request(port_of(edge), entry["method"], expand(entry["path"]), body, headers)
    assert status == entry["status"], got[:500]
    assert error_reason(entry.get("shape"), status, got) == entry["reason"]
    assert seconds < entry.get("max_seconds", time_bound(len(body or b""))), seconds


def error_reason(shape: str | None, status: int, body: bytes) -> str:
    """The reason of an error answer in its protocol's shape (the HTTP adapter's wires; docs/http.md)."""
    if shape == "cohere":
        return json.loads(body)["reason"]
    if shape == "tei":
        return json.loads(body)["error_type"]
    if shape == "reference":
        return json.loads(body)["error"]["code"]
    return assert_json_error(status, body)["reason"]


# --- the oracle -----------------------------------------------------------------------------------------------


class Refused(Exception):
    pass


def strict_json(text: bytes) -> Any:
    """RFC 8259 JSON, as the edge reads it: one value, no NaN or Infinity, no key twice in an object."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            raise Refused("a key twice")
        return dict(pairs)

    def no_constant(name: str) -> Any:
        raise Refused(name)

    try:
        return json.loads(text, object_pairs_hook=no_duplicates, parse_constant=no_constant)
    except (ValueError, RecursionError) as error:
        raise Refused(str(error)) from None


def within_edge_limits(text: bytes, value: Any) -> None:
    count, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        count += 1
        if depth > MAX_DEPTH or count > MAX_VALUES:
            raise Refused("too deep or too many values")
        if isinstance(item, dict):
            pending.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            pending.extend((child, depth + 1) for child in item)
    digits = 0
    for byte in text:  # a number's characters in a row, as a bound on any number token
        digits = digits + 1 if chr(byte) in "0123456789+-.eE" else 0
        if digits > MAX_NUMBER:
            raise Refused("a long number")


def contract_refuses(body: bytes) -> bool:
    """Whether the contract refuses `body` as an encode body on /v1/encode/{model} (the model is in the path)."""
    try:
        value = strict_json(body)
        within_edge_limits(body, value)
        if not isinstance(value, dict) or "model" in value:
            return True
        json_format.ParseDict(value, inference_pb2.EncodeRequest(), ignore_unknown_fields=False)
    except (Refused, json_format.ParseError, TypeError, ValueError, AttributeError):
        return True
    return False


# --- the generators -------------------------------------------------------------------------------------------

ENCODE_PATHS = [
    f"/v1/encode/{MEAN}",
    f"/v1/encode/{MEAN}/",
    f"//v1/encode/{MEAN}",
    f"/v1//encode/{MEAN}",
    "/v1/encode/" + MEAN.replace("/", "%2F"),
    "/v1/encode/" + MEAN.replace("/", "%2f") + "/",
    f"/v1/./encode/{MEAN}",
    f"/v1/x/../encode/{MEAN}",
]
OTHER_PATHS = [
    f"/v1/encode/{MEAN}?dims=8",
    f"/v1/encode/{MEAN}/?model=x",
    "/v1/encode/",
    "/v1/encode",
    f"/V1/encode/{MEAN}",
    f"/v1/encode/{MEAN}/extra/",
    "/sie.v1.Inference/Encode",
    "/sie.v1.ConfigService/AddModel",
    "/v1/embeddings/",
    "/v1/configs/models/",
    "/v1/pools/p/renew/",
    "/v1/pools/p/?name=q",
    f"/v1/encode/{MEAN}#frag",
    f"/v1/encode/{MEAN}%00",
    f"/v1/encode/{MEAN};x=1",
    "/v1/encode/..%2F..%2Fetc%2Fpasswd",
]
FIELDS = ["items", "output_types", "outputTypes", "output_dtype", "instruction", "is_query", "isQuery", "dims",
          "profile", "lora", "options", "request_id", "debug", "params", "model", "colour", "text", "images"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20), st.sampled_from(["true", "dense", "float32", "8", ""]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
items = st.lists(
    st.one_of(
        st.fixed_dictionaries({"text": st.text(max_size=30)}),
        st.fixed_dictionaries({"id": st.text(max_size=5), "text": st.text(max_size=30)}, optional={"metadata": values}),
        values,
    ),
    min_size=0,
    max_size=4,
)
bodies = st.one_of(
    st.fixed_dictionaries({"items": items}, optional={field: values for field in FIELDS if field != "items"}),
    st.dictionaries(st.sampled_from(FIELDS), values, max_size=5),
    values,
)


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    text = json.dumps(draw(bodies), ensure_ascii=draw(st.booleans()))
    mutation = draw(st.sampled_from(["none", "none", "trailing comma", "single quotes", "cut", "byte", "spaces", "bom"]))
    if mutation == "trailing comma":
        text = text[:-1] + ",}" if text.endswith("}") else text + ","
    elif mutation == "single quotes":
        text = text.replace('"', "'")
    elif mutation == "cut":
        text = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    elif mutation == "spaces":
        text = text.replace(":", " :\v ")
    elif mutation == "bom":
        text = "\ufeff" + text
    data = text.encode()
    if mutation == "byte" and data:
        at = draw(st.integers(0, len(data) - 1))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1 :]
    return data


headers = st.dictionaries(
    st.sampled_from(["content-type", "x-sie-pool", "x-sie-machine-profile", "idempotency-key", "x-extra", "te", "accept"]),
    st.sampled_from(["application/json", "application/json; charset=utf-8", "text/plain", "application/grpc-web",
                     "application/x-www-form-urlencoded", "", "l4", "x" * 200, "x" * 12000, "trailers"]),
    max_size=3,
)


@settings(max_examples=1000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE"]),
       path=st.sampled_from(ENCODE_PATHS) | st.sampled_from(OTHER_PATHS), body=raw_bodies(), extra=headers)
# Envoy's own refusal (a fragment fails path normalization) to a grpc-web caller: it got a 400 with no body while the
# local replies took every application/grpc* content type for native gRPC
@example(method="POST", path=f"/v1/encode/{MEAN}#frag", body=b"{}", extra={"content-type": "application/grpc-web"})
def test_generated_requests_get_a_bounded_documented_answer(edge, method, path, body, extra) -> None:
    started = time.monotonic()
    status, seconds, got = request(port_of(edge), method, path, body, extra)
    assert time.monotonic() - started < time_bound(len(body)), (method, path, body[:200])
    if status == 200:
        assert method == "POST" and path in ENCODE_PATHS, (method, path, got[:300])
        assert not contract_refuses(body), (path, body[:500], got[:300])
        assert "results" in json.loads(got)
        return
    assert_json_error(status, got)
    if method == "POST" and path in ENCODE_PATHS and contract_refuses(body):
        assert 400 <= status < 500, (status, body[:300], got[:300])
