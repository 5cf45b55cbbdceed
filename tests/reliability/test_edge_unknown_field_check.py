"""Attacks on the HTTP/JSON edge's unknown-field check (the Lua filter in front of Envoy's transcoder).

The transcoder's JSON parser is more lenient than JSON, and it transcodes
content types the filter used to skip as gRPC: each case below used to answer
200 with a field silently dropped. A long key over a long list used to cost
Envoy time quadratic in the body, for a caller without a token.
"""

from __future__ import annotations

import json
import subprocess

import grpc
import numpy as np
import pytest

from grpc_helpers import error_reason
from sie.v1 import inference_pb2, inference_pb2_grpc

from edge_helpers import MEAN, Edge
from reliability.test_http_hostile import AUTH, reason

ITEMS = '"items": [{"text": "a query over http"}]'


def post(
    edge: Edge,
    body: bytes,
    content_type: str = "application/json",
    token: bool = True,
    timeout_s: int = 60,
    query: str = "",
    path: str = f"/v1/encode/{MEAN}",
) -> tuple[int, dict]:
    """POST raw bytes (to the encode route unless `path` says otherwise); with no answer within `timeout_s` the status is 0 (or 100 after `expect: 100-continue`)."""
    command = [
        "curl",
        "-s",
        "-m",
        str(timeout_s),
        "-X",
        "POST",
        "-w",
        "\n%{http_code}",
        "-H",
        f"content-type: {content_type}",
    ]
    if token:
        command += ["-H", f"authorization: {AUTH['authorization']}"]
    command += ["--data-binary", "@-", f"{edge.base}{path}{query}"]
    output = subprocess.run(
        command, input=body, capture_output=True, timeout=timeout_s + 30
    ).stdout.decode()
    text, _, status = output.rpartition("\n")
    try:
        return int(status), json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return int(status), {"text": text}


LENIENT = [
    ("trailing comma in a list", "{" + ITEMS[:-1] + ',], "colour": 1}', "INVALID_JSON"),
    (
        "trailing comma in an object",
        '{"items": [{"text": "x",}], "colour": 1}',
        "INVALID_JSON",
    ),
    ("single quotes", "{'items': [{'text': 'x'}], 'colour': 1}", "INVALID_JSON"),
    ("unquoted keys", '{items: [{"text": "x"}], colour: 1}', "INVALID_JSON"),
    ("vertical tab between fields", "{" + ITEMS + ',\v"colour": 1}', "INVALID_JSON"),
    ("vertical tab before the body", "\v{" + ITEMS + ', "colour": 1}', "INVALID_JSON"),
    (
        "an escaped backslash before u0069",
        "{" + ITEMS + ', "\\\\u0069s_query": true}',
        "UNKNOWN_FIELD",
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "expected"), LENIENT, ids=[case[0] for case in LENIENT]
)
def test_json_the_transcoder_reads_leniently_cannot_hide_a_field(
    auth_edge, name, body, expected
) -> None:
    status, got = post(auth_edge, body.encode())
    assert status == 400, (name, got)
    assert reason(got) == expected, got
    if expected == "UNKNOWN_FIELD":
        assert got["details"][0]["metadata"] == {"field": "\\u0069s_query"}, got
    else:
        offset = int(got["details"][0]["metadata"]["offset"])
        assert 0 <= offset < len(body) and "not strict JSON" in got["message"], got


@pytest.mark.parametrize(
    "content_type",
    ["application/grpc-web", "application/grpcx", "application/grpc; charset=utf-8"],
)
def test_a_grpc_looking_content_type_does_not_skip_the_check(
    auth_edge, content_type
) -> None:
    """Envoy transcodes these as JSON (only application/grpc and application/grpc+... are gRPC to it)."""
    status, got = post(auth_edge, ("{" + ITEMS + ', "colour": 1}').encode(), content_type)
    assert status == 400 and reason(got) == "UNKNOWN_FIELD", got
    assert got["details"][0]["metadata"] == {"field": "colour"}


def test_strict_json_with_escapes_passes_and_an_escaped_key_is_its_field(auth_edge) -> None:
    plain = post(auth_edge, ("{" + ITEMS + ', "is_query": true}').encode())
    escaped = post(
        auth_edge,
        (
            '{\r\n\t"items": [{"text": "a query over http", "metadata": '
            + '{"s": "\\"\\\\\\u00e9\\/", "n": [-1.5e-3, 0, true, null, {}, []]}}]'
            + ' , "\\u0069s_\\u0071uery" : true, "options": {"\\u0069s_query": true}}'
        ).encode(),
    )
    assert plain[0] == 200 and escaped[0] == 200, (plain, escaped)
    np.testing.assert_array_equal(
        escaped[1]["results"][0]["dense"]["values"],
        plain[1]["results"][0]["dense"]["values"],
    )


def test_a_long_key_over_a_long_list_does_not_stall_envoy(auth_edge) -> None:
    """4 MB key, 60,000 list items under it, no token: the check used to copy the key's path for each
    item (400 GB of copying, Envoy's worker busy for many minutes); it is linear now and the caller
    gets its 401 at once. (100,000 items are over the check's 65,536 values: 400 TOO_MANY_VALUES.)"""
    body = (
        '{"options": {"'
        + "k" * (4 * 2**20)
        + '": ['
        + ",".join(["1"] * 60_000)
        + "]}}"
    )
    status, got = post(auth_edge, body.encode(), token=False)
    assert status == 401 and reason(got) == "MISSING_TOKEN", (status, str(got)[:300])


def test_a_body_nested_past_the_checks_depth_is_refused_before_the_transcoder(
    auth_edge,
) -> None:
    body = "{" + ITEMS + ', "options": {"a": ' + "[" * 70 + "]" * 70 + '}, "colour": 1}'
    status, got = post(auth_edge, body.encode())
    assert (
        status == 400
        and reason(got) == "INVALID_JSON"
        and "deeper than 64" in got["message"]
    ), got


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ("?dims=8", "dims"),
        ("?model=test/tiny-splade", "model"),
        ("?is_query=false&x=1", "is_query"),
    ],
)
def test_a_query_string_on_a_body_route_is_refused_naming_it(
    auth_edge, query, parameter
) -> None:
    """The transcoder also reads fields from the query string: `?dims=8` was dropped under the body's
    `dims`, and `?model=` replaced the path's model."""
    status, got = post(auth_edge, ("{" + ITEMS + ', "dims": 16}').encode(), query=query)
    assert status == 400 and reason(got) == "QUERY_NOT_ALLOWED", got
    assert got["details"][0]["metadata"] == {"parameter": parameter}


def test_a_percent_encoded_slash_in_a_model_id_is_the_slash(auth_edge) -> None:
    """`encodeURIComponent(model)` writes `test%2Ftiny-mean`: the transcoder kept `%2F` as it came."""
    described = subprocess.run(
        [
            "curl",
            "-s",
            "-H",
            f"authorization: {AUTH['authorization']}",
            f"{auth_edge.base}/v1/models/{MEAN.replace('/', '%2F')}",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    assert json.loads(described)["id"] == MEAN, described[:300]
    status, got = post(
        auth_edge,
        ("{" + ITEMS + "}").encode(),
        path=f"/v1/encode/{MEAN.replace('/', '%2F')}",
    )
    assert status == 200 and got["model"] == MEAN, got


def test_a_model_name_over_its_bound_is_refused_before_an_error_quotes_it(auth_edge) -> None:
    """DescribeModel and GetModel quoted any name back, twice: 100 kB of name broke the answer's
    trailers (the client read RESOURCE_EXHAUSTED "received metadata size exceeds hard limit")."""
    described = subprocess.run(
        [
            "curl",
            "-s",
            "-w",
            "\n%{http_code}",
            "-H",
            f"authorization: {AUTH['authorization']}",
            f"{auth_edge.base}/v1/models/{'a' * 300}",
        ],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()
    text, _, status = described.rpartition("\n")
    assert status == "400" and reason(json.loads(text)) == "NAME_TOO_LONG", described[
        :300
    ]
    metadata = (("authorization", AUTH["authorization"]),)
    with grpc.insecure_channel(auth_edge.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for call, request in [
            (
                stub.DescribeModel,
                inference_pb2.DescribeModelRequest(model="a" * 100_000),
            ),
            (stub.GetModel, inference_pb2.GetModelRequest(model="a" * 100_000)),
        ]:
            with pytest.raises(grpc.RpcError) as raised:
                call(request, metadata=metadata, timeout=30)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                raised.value.details()
            )
            assert error_reason(raised.value) == "NAME_TOO_LONG"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        (f"/v1/encode/{MEAN}", '{"model": "test/tiny-splade", ' + ITEMS + "}", "model"),
        ("/v1/pools/p/renew", '{"name": "someone-elses"}', "name"),
    ],
    ids=["encode model", "renewed pool"],
)
def test_a_body_field_the_path_binds_is_refused(auth_edge, path, body, field) -> None:
    """The transcoder let the body override the path: POST /v1/encode/a with {"model": "b"} encoded with
    b, and POST /v1/pools/p/renew with {"name": "q"} renewed q."""
    status, got = post(auth_edge, body.encode(), path=path)
    assert status == 400 and reason(got) == "FIELD_IN_PATH", got
    assert (
        got["details"][0]["metadata"] == {"field": field}
        and "given by the path" in got["message"]
    )


@pytest.mark.parametrize(
    ("method", "path", "parameter"),
    [
        ("DELETE", "/v1/pools/p?name=q", "name"),
        ("GET", f"/v1/models/{MEAN}?model=test/tiny-ner", "model"),
        ("GET", "/v1/models?page=2", "page"),
    ],
)
def test_a_query_string_on_a_route_without_a_body_is_refused_naming_it(
    auth_edge, method, path, parameter
) -> None:
    """DELETE /v1/pools/p?name=q deleted pool q; an unknown parameter was a misleading 404 ROUTE_NOT_FOUND."""
    output = subprocess.run(
        [
            "curl",
            "-s",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
            "-H",
            f"authorization: {AUTH['authorization']}",
            auth_edge.base + path,
        ],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout.decode()
    text, _, status = output.rpartition("\n")
    got = json.loads(text)
    assert status == "400" and reason(got) == "QUERY_NOT_ALLOWED", output[:300]
    assert got["details"][0]["metadata"] == {"parameter": parameter}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("{" + ITEMS + ', "is_query": true, "isQuery": false}', "isQuery"),
        (
            "{" + ITEMS + ', "params": {"dims": 8}, "params": {"is_query": true}}',
            "params",
        ),
        ('{"items": [{"text": "x", "text": "y"}]}', "items[0].text"),
    ],
    ids=["both spellings", "params twice", "in an item"],
)
def test_a_field_given_twice_is_refused_naming_it(auth_edge, body, field) -> None:
    """The transcoder kept one of the values without a word (`is_query: true, isQuery: false`
    embedded a document)."""
    status, got = post(auth_edge, body.encode())
    assert status == 400 and reason(got) == "DUPLICATE_FIELD", got
    assert got["details"][0]["metadata"] == {"field": field}


def test_a_pool_name_no_pool_can_have_is_refused_without_quoting_it_whole(auth_edge) -> None:
    """GetPool, DeletePool and RenewPool quoted any name back twice in their NOT_FOUND: 100 kB of name
    made trailers the client refuses (it read RESOURCE_EXHAUSTED, a retryable status), and etcd was asked
    for the key first."""
    metadata = (("authorization", AUTH["authorization"]),)
    name = "a" * 100_000
    with grpc.insecure_channel(auth_edge.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for call, request in [
            (stub.GetPool, inference_pb2.GetPoolRequest(name=name)),
            (stub.DeletePool, inference_pb2.DeletePoolRequest(name=name)),
            (stub.RenewPool, inference_pb2.RenewPoolRequest(name=name)),
        ]:
            with pytest.raises(grpc.RpcError) as raised:
                call(request, metadata=metadata, timeout=30)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (
                raised.value.details()
            )
            assert (
                error_reason(raised.value) == "NAME_TOO_LONG"
                and len(raised.value.details()) < 300
            )
