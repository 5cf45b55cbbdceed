"""A request with more than one `authorization` header is refused (issue 32).

The first header used to win: one check could read one token while an intermediary, a log or a pool's owner check
read another. Now every service refuses such a request UNAUTHENTICATED (DUPLICATE_AUTHORIZATION, HTTP 401) before
anything else, with or without a token check: the gateway over gRPC (direct and through Envoy) and HTTP through
Envoy (transcoded routes and the HTTP adapter's), the worker, the config service. Envoy joins repeated
`authorization` headers into one value with commas, so a value with a comma is refused the same way.
"""

from __future__ import annotations

import http.client
import json

import grpc
import pytest

from edge_helpers import ADMIN_TOKEN, AUTH_TOKEN, MEAN, Edge
from grpc_helpers import encode_request, error_reason
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2_grpc

WRONG = "Bearer not-a-token"
# The two orders: a good token first (the one that used to win) and last.
PAIRS = [(f"Bearer {AUTH_TOKEN}", WRONG), (WRONG, f"Bearer {AUTH_TOKEN}")]


def _refused(call: object) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        call()  # type: ignore[operator]
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
    assert error_reason(refused.value) == "DUPLICATE_AUTHORIZATION"
    assert "send exactly one" in (refused.value.details() or "")


def _metadata(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    return tuple(("authorization", value) for value in values)


@pytest.mark.parametrize("values", PAIRS)
@pytest.mark.parametrize("through", ["gateway", "envoy"])
def test_the_gateway_refuses_two_authorization_headers_over_grpc(auth_edge: Edge, values, through) -> None:
    address = auth_edge.gateway.address if through == "gateway" else auth_edge.address
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        good = next(value for value in values if AUTH_TOKEN in value)
        assert stub.Encode(encode_request(MEAN, ["one token"]), metadata=_metadata((good,)), timeout=30).results
        _refused(lambda: stub.Encode(encode_request(MEAN, ["two tokens"]), metadata=_metadata(values), timeout=30))


def test_a_gateway_without_token_checks_refuses_two_authorization_headers_too(edge: Edge) -> None:
    """Without SIE_AUTH_MODE=static nothing checks the token, but pools are owned by it: still refused."""
    with grpc.insecure_channel(edge.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert stub.Encode(encode_request(MEAN, ["no token"]), timeout=30).results
        _refused(
            lambda: stub.Encode(encode_request(MEAN, ["two"]), metadata=_metadata(("Bearer a", "Bearer b")), timeout=30)
        )
        # Two values joined into one header, as proxies join repeated headers.
        _refused(lambda: stub.Encode(encode_request(MEAN, ["joined"]), metadata=_metadata(("Bearer a, Bearer b",))))


def _post(edge: Edge, path: str, body: dict, values: tuple[str, ...]) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(edge.address.split(":")[0], int(edge.address.split(":")[1]), timeout=60)
    try:
        payload = json.dumps(body).encode()
        connection.putrequest("POST", path)
        connection.putheader("content-type", "application/json")
        connection.putheader("content-length", str(len(payload)))
        for value in values:
            connection.putheader("authorization", value)
        connection.endheaders(payload)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        connection.close()


def _reason(body: dict) -> str | None:
    infos = [detail for detail in body.get("details", []) if detail.get("@type", "").endswith("ErrorInfo")]
    if infos:
        return infos[0]["reason"]
    error = body.get("error")  # the foreign wires' shape
    return error.get("code") if isinstance(error, dict) else None


ROUTES = [
    (f"/v1/encode/{MEAN}", {"items": [{"text": "x"}]}),  # transcoded by Envoy to the gateway's gRPC
    ("/v1/embeddings", {"model": MEAN, "input": "x"}),  # the gateway's HTTP adapter
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
@pytest.mark.parametrize("values", PAIRS)
def test_the_gateway_refuses_two_authorization_headers_over_http(auth_edge: Edge, path, body, values) -> None:
    good = next(value for value in values if AUTH_TOKEN in value)
    assert _post(auth_edge, path, body, (good,))[0] == 200
    status, answer = _post(auth_edge, path, body, values)
    assert status == 401, answer
    assert "DUPLICATE_AUTHORIZATION" in json.dumps(answer), answer


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[path for path, _ in ROUTES])
def test_http_without_token_checks_refuses_two_authorization_headers(edge: Edge, path, body) -> None:
    assert _post(edge, path, body, ())[0] == 200
    status, answer = _post(edge, path, body, ("Bearer a", "Bearer b"))
    assert status == 401, answer
    assert "DUPLICATE_AUTHORIZATION" in json.dumps(answer), answer


def test_the_worker_refuses_two_authorization_headers(edge: Edge) -> None:
    worker = next(process for process in edge.cluster.processes if process.module == "sie_worker")
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert stub.Encode(encode_request(MEAN, ["direct"]), timeout=30).results
        _refused(
            lambda: stub.Encode(encode_request(MEAN, ["two"]), metadata=_metadata(("Bearer a", "Bearer b")), timeout=30)
        )


def test_the_config_service_refuses_two_authorization_headers_even_both_the_admin_token(edge: Edge) -> None:
    admin_token = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    request = config_pb2.AddModelRequest(config={"id": "test/duplicate-auth", "hf_id": "org/model"})
    with grpc.insecure_channel(edge.cluster.config.address) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        admin.ListModelConfigs(config_pb2.ListModelConfigsRequest(), metadata=admin_token, timeout=30)
        _refused(lambda: admin.AddModel(request, metadata=admin_token * 2, timeout=30))
        _refused(lambda: admin.AddModel(request, metadata=(*admin_token, ("authorization", WRONG)), timeout=30))
        _refused(
            lambda: admin.ListModelConfigs(config_pb2.ListModelConfigsRequest(), metadata=admin_token * 2, timeout=30)
        )
