"""Envoy's small buffers still carry the largest messages the contract allows. The listener's per-connection buffer is
1 MiB and an HTTP/2 stream's window 64 KiB (envoy_config.CONNECTION_BUFFER_BYTES, STREAM_WINDOW_BYTES), so that slow
senders and native gRPC calls wait in flow control rather than in Envoy's heap (test_edge_memory,
test_envoy_native_grpc_overload); the request check and the route guard hold a JSON body whole, and the transcoder an
answer, without being held to them. A body just under the 16 MiB limit over HTTP/1 and HTTP/2, a 15 MiB native call,
and a 20 MB answer each way pass whole. Behind Envoy: a gRPC server in this process whose Encode answers with the
request's text lengths and, for the model "big", a 20 MB request id."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from edge_load import request

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.runtime.settings import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess, free_port

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

MiB = 2**20
BIG_ANSWER = 20_000_000
ITEM_TEXT = 2000


class Echo(inference_pb2_grpc.InferenceServicer):
    def Encode(self, request: inference_pb2.EncodeRequest, context: grpc.ServicerContext) -> object:
        if request.model == "big":
            return inference_pb2.EncodeResponse(model=request.model, request_id="y" * BIG_ANSWER)
        total = sum(len(item.text) for item in request.items)
        return inference_pb2.EncodeResponse(model=request.model, request_id=f"{len(request.items)} {total}")


@pytest.fixture(scope="module")
def edge(tmp_path_factory) -> Iterator[int]:
    """Envoy's port in front of Echo."""
    tmp: Path = tmp_path_factory.mktemp("buffers")
    limits = [("grpc.max_receive_message_length", 64 * MiB), ("grpc.max_send_message_length", 64 * MiB)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=limits)
    inference_pb2_grpc.add_InferenceServicer_to_server(Echo(), server)
    gateway = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(gateway)
    server.start()
    port, admin_port = free_port(), free_port()
    (tmp / "envoy.json").write_text(
        json.dumps(render(listen_port=port, admin_port=admin_port, gateway=gateway, config=gateway))
    )
    envoy = EnvoyProcess(tmp / "envoy.json", tmp / "envoy.log", admin_port)
    try:
        envoy.wait_ready()
        yield port
    finally:
        envoy.stop()
        server.stop(0)


def largest_body() -> tuple[bytes, int, int]:
    """A JSON encode body just under the limit: (body, items, characters of text)."""
    item = json.dumps({"text": "x" * ITEM_TEXT})
    count = (DEFAULT_MAX_RECEIVE_MESSAGE_BYTES - 64) // (len(item) + 1)
    body = ('{"items":[' + ",".join([item] * count) + "]}").encode()
    assert DEFAULT_MAX_RECEIVE_MESSAGE_BYTES - 4 * 1024 < len(body) <= DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
    return body, count, count * ITEM_TEXT


def test_a_json_body_at_the_limit_passes_over_http1(edge) -> None:
    port = edge
    body, count, text = largest_body()
    status, _, answer = request(port, "POST", "/v1/encode/m", body)
    assert (status, json.loads(answer)["request_id"]) == (200, f"{count} {text}")


def test_a_json_body_at_the_limit_passes_over_http2(edge, tmp_path) -> None:
    port = edge
    body, count, text = largest_body()
    (tmp_path / "body.json").write_bytes(body)
    command = [
        "curl", "-s", "--http2-prior-knowledge", "-H", "content-type: application/json",
        "--data-binary", f"@{tmp_path / 'body.json'}", "-w", "\n%{http_code}", f"http://127.0.0.1:{port}/v1/encode/m",
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    answer, _, status = output.rpartition("\n")
    assert (status, json.loads(answer)["request_id"]) == ("200", f"{count} {text}")


def test_a_large_native_call_and_large_answers_pass(edge) -> None:
    port = edge
    count = 15 * MiB // (ITEM_TEXT + 8)
    message = inference_pb2.EncodeRequest(model="m", items=[types_pb2.Item(text="x" * ITEM_TEXT)] * count)
    options = [("grpc.max_send_message_length", 64 * MiB), ("grpc.max_receive_message_length", 64 * MiB)]

    def calls() -> tuple[str, int]:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            echoed = stub.Encode(message, timeout=60).request_id
            big = stub.Encode(inference_pb2.EncodeRequest(model="big"), timeout=60).request_id
        return echoed, len(big)

    assert calls() == (f"{count} {count * ITEM_TEXT}", BIG_ANSWER)
    status, _, answer = request(port, "POST", "/v1/encode/big", b'{"items": []}')
    assert (status, len(json.loads(answer)["request_id"])) == (200, BIG_ANSWER)
