"""Caller values that used to answer RESOURCE_EXHAUSTED "metadata size exceeds hard limit" (HTTP 429, which invites
retries) or had no bound at all now answer INVALID_ARGUMENT with a reason, at the gateway and at the worker alike:
option keys, item metadata, image format hints, the OpenAI `user`, model ids in a path (tests/test_error_bounds.py:
any error's message is bounded). Last, a killed gateway: Envoy answers JSON 503s until it is back."""

from __future__ import annotations

import base64
import json

import grpc
import pytest
from google.protobuf import struct_pb2
from edge_load import request
from grpc_helpers import error_reason
from local_cluster import wait_until
from test_http_edge import CLIP, MEAN, curl, running_edge

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

ITEM = {"text": "x"}
# sie_common.edge.errors.MAX_MESSAGE_CHARS (a literal, so this test runs against code without it too)
MAX_MESSAGE_CHARS = 1024


@pytest.fixture(scope="module")
def edge(tmp_path_factory, etcd_server, tiny_models):
    with running_edge(tmp_path_factory.mktemp("edge-bounds"), etcd_server.endpoint, tiny_models) as running:
        yield running


def post(edge, path: str, body: object) -> tuple[int, dict]:
    """POST a JSON body of any size (curl takes the body as an argument, and an argument has at most 128 KiB)."""
    status, _, got = request(int(edge.base.rsplit(":", 1)[1]), "POST", path, json.dumps(body).encode())
    return status, json.loads(got)


def reason(body: dict) -> str:
    return body["details"][0]["reason"]


def options(**values: object) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


# (name, HTTP path, JSON body, the gRPC request to the gateway and to the worker, reason)
CASES = [
    (
        "15 KB option key",
        f"/v1/encode/{MEAN}",
        {"items": [ITEM], "options": {"k" * 15_000: 1}},
        inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")], options=options(**{"k" * 15_000: 1})),
        "KEY_TOO_LONG",
    ),
    (
        "item metadata of 3 x 5 MB",
        f"/v1/encode/{MEAN}",
        {"items": [{"text": "x", "metadata": {"m": "v" * (5 * 2**20)}}] * 3},
        inference_pb2.EncodeRequest(
            model=MEAN, items=[types_pb2.Item(text="x", metadata=options(m="v" * (5 * 2**20)))] * 3
        ),
        "METADATA_TOO_LARGE",
    ),
    (
        "1 MB image format hint",
        f"/v1/encode/{CLIP}",
        {"items": [{"images": [{"data": base64.b64encode(b"\x89PNG").decode(), "format": "p" * 2**20}]}]},
        inference_pb2.EncodeRequest(
            model=CLIP, items=[types_pb2.Item(images=[types_pb2.Image(data=b"\x89PNG", format="p" * 2**20)])]
        ),
        "IMAGE_FORMAT_TOO_LONG",
    ),
    (
        "10 MB OpenAI user",
        "/v1/embeddings",
        {"model": MEAN, "input": "x", "user": "u" * (10 * 2**20)},
        inference_pb2.CreateEmbeddingsRequest(model=MEAN, input=struct_pb2.Value(string_value="x"), user="u" * (10 * 2**20)),
        "USER_TOO_LONG",
    ),
]


@pytest.mark.parametrize(("name", "path", "body", "message", "expected"), CASES, ids=[case[0] for case in CASES])
def test_an_overlong_value_is_invalid_argument_with_its_reason_everywhere(edge, name, path, body, message, expected, reliability_report) -> None:
    status, got = post(edge, path, body)
    reliability_report.add("edge", f"bounds over HTTP: {name}", status=status, reason=got.get("details", [{}])[0].get("reason"))
    assert (status, reason(got)) == (400, expected), got
    assert len(got["message"]) <= MAX_MESSAGE_CHARS
    method = "CreateEmbeddings" if isinstance(message, inference_pb2.CreateEmbeddingsRequest) else "Encode"
    worker = next(process for process in edge.cluster.processes if "edge-worker" in str(process.log_path))
    for address in (edge.gateway.address, worker.address):
        options_ = [("grpc.max_send_message_length", 64 * 2**20)]
        with grpc.insecure_channel(address, options=options_) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                getattr(inference_pb2_grpc.InferenceStub(channel), method)(message, timeout=60)
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (address, raised.value.details()[:300])
        assert error_reason(raised.value) == expected


def test_model_ids_in_a_path_are_bounded_with_reasons(edge) -> None:
    status, got = post(edge, "/v1/encode/" + "m" * 8192, {"items": [ITEM]})
    assert (status, reason(got)) == (431, "HEADERS_TOO_LARGE")
    status, got = post(edge, "/v1/encode/" + "m" * 4096, {"items": [ITEM]})
    assert (status, reason(got)) == (414, "PATH_TOO_LONG")
    status, got = curl(edge, "POST", "/v1/encode/" + "m" * 1024, {"items": [ITEM]})
    assert (status, reason(got)) == (400, "NAME_TOO_LONG")


def test_a_trailing_slash_or_an_escaped_slash_serves_the_same_model(edge) -> None:
    answers = [curl(edge, "POST", path, {"items": [ITEM]}) for path in (f"/v1/encode/{MEAN}", f"/v1/encode/{MEAN}/", "/v1/encode/" + MEAN.replace("/", "%2F"))]
    assert [status for status, _ in answers] == [200, 200, 200]
    assert len({json.dumps(body["results"][0]["dense"]["values"]) for _, body in answers}) == 1


def test_a_killed_gateway_gives_json_503s_until_it_is_back(edge) -> None:
    """Last in this module: it kills the gateway. Every answer meanwhile is a JSON error body (plain text before)."""
    edge.gateway.process.kill()
    edge.gateway.process.wait()
    seen = set()
    for _ in range(15):
        status, got = curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [ITEM]})
        assert status == 503 and "text" not in got, got
        assert got["code"] == 14 and reason(got) == "UPSTREAM_UNAVAILABLE"
        seen.add(got["details"][0]["metadata"]["envoy"].split("{")[0])
    assert seen, "answered by Envoy"
    restarted = edge.cluster.start_gateway(port=edge.gateway.port, SIE_GATEWAY_CONFIGURED_GPUS="l4")
    edge.gateway = restarted
    wait_until(lambda: curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [ITEM]})[0] == 200, timeout_s=60, what="served again")
