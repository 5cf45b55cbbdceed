"""Native gRPC callers through Envoy under a memory attack get a status with a reason, never a reset (issue 32: 16
connections x 4 concurrent native 15 MiB Encode calls through Envoy; Envoy's overload manager reset some, and those
callers saw INTERNAL "Received RST_STREAM", while HTTP callers got the mapped 503 OVERLOADED).

Envoy let each HTTP/2 stream hold what its flow-control window allowed (Envoy's default, 256 MiB) and read 16 MiB from
a connection at once, so the 64 messages sat in its heap while the gateway read two of them at a time; past 85% of the
heap limit the overload manager reset the streams holding the most. Now a stream's window, a connection's and a read are
CONNECTION_BUFFER_BYTES (1 MiB): the callers wait in flow control, not in Envoy's heap, the gateway answers each
(RESOURCE_EXHAUSTED OVERLOADED for what its budget cannot read), and what Envoy itself answers a native caller carries
an ErrorInfo. Envoy runs with a 192 MiB heap limit here (the smallest the renderer takes with 16 MiB bodies) so the old
buffers reach the reset threshold every time, not only on a busy machine; the gateway is the stand-in of
test_gateway_grpc_budget (its real intake, a servicer that holds what it reads) in a process of its own."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.rpc import status_pb2

from grpc_helpers import error_reason, retry_delay_s
from local_cluster import wait_until
from reliability.test_gateway_grpc_budget import QUICK_MODEL, encode_request
from sie.v1 import inference_pb2
from sie_common.edge.errors import status_reason
from sie_common.runtime.settings import load_settings
from sie_gateway.settings import GatewaySettings
from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess, free_port

# Starts processes (the stand-in gateway, Envoy).
pytestmark = pytest.mark.process

MiB = 2**20
ENCODE = "/sie.v1.Inference/Encode"
HEAP_LIMIT = 256 * MiB
# Where the overload manager starts to act (envoy_config._overload_manager: idle timeouts shrink from 85%).
ACTS_FROM = HEAP_LIMIT * 85 // 100


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    """(Envoy's port, its admin port) in front of the stand-in gateway."""
    tmp = tmp_path_factory.mktemp("native-overload")
    tests = str(Path(__file__).parents[1])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    gateway_port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "reliability.test_gateway_grpc_memory", "serve", str(gateway_port)],
        env=environ,
        stdout=subprocess.PIPE,
    )
    envoy = None
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == b"serving"
        port, admin_port = free_port(), free_port()
        gateway = f"127.0.0.1:{gateway_port}"
        config = render(
            listen_port=port, admin_port=admin_port, gateway=gateway, config=gateway, max_heap_bytes=HEAP_LIMIT
        )
        (tmp / "envoy.json").write_text(json.dumps(config))
        envoy = EnvoyProcess(tmp / "envoy.json", tmp / "envoy.log", admin_port)
        envoy.wait_ready()
        yield port, admin_port
    finally:
        if envoy is not None:
            envoy.stop()
        server.kill()
        server.wait()


def heap_bytes(admin_port: int) -> int:
    """What the overload manager's fixed heap monitor counts: tcmalloc's heap less what it gave back."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/memory", timeout=5) as reply:
        memory = json.loads(reply.read())
    return int(memory["heap_size"]) - int(memory["pageheap_unmapped"])


async def attack(port: int, admin_port: int, channels: int = 16, calls_per_channel: int = 4) -> dict[str, object]:
    """`channels` connections, each with `calls_per_channel` native 16,000,000-byte Encode calls at once (the stand-in
    holds what it reads, so the budget fills and stays full): 'CODE REASON' of each that failed, and Envoy's peak heap."""
    message = encode_request(16_000_000).SerializeToString()
    options = [("grpc.max_send_message_length", 64 * MiB)]
    links = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(channels)]
    peak = 0
    try:
        calls = [link.unary_unary(ENCODE)(message, timeout=120) for link in links for _ in range(calls_per_channel)]
        settled = 0.0
        while settled < 2.0:  # until no call has ended for 2 s
            done = sum(call.done() for call in calls)
            peak = max(peak, await asyncio.to_thread(heap_bytes, admin_port))
            await asyncio.sleep(0.1)
            settled = settled + 0.1 if sum(call.done() for call in calls) == done else 0.0
        outcomes = []
        for call in calls:
            if not call.done():
                call.cancel()
                outcomes.append("running")
                continue
            try:
                await call
                outcomes.append("OK")
            except grpc.aio.AioRpcError as error:
                details = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin", b"")
                reason = status_reason(status_pb2.Status.FromString(details)) if details else f"({error.details()})"
                outcomes.append(f"{error.code().name} {reason}")
    finally:
        for link in links:
            await link.close()
    return {"outcomes": outcomes, "peak_heap": peak}


def test_native_calls_past_the_gateways_budget_are_answered_not_reset(edge, reliability_report) -> None:
    port, admin_port = edge
    idle = heap_bytes(admin_port)
    result = asyncio.run(attack(port, admin_port))
    outcomes: list[str] = result["outcomes"]  # type: ignore[assignment]
    peak: int = result["peak_heap"]  # type: ignore[assignment]
    reliability_report.add(
        "edge", "native gRPC through Envoy: 16 connections x 4 calls of 16 MB, heap limit 256 MiB",
        envoy_heap_mb=f"{idle // MiB} -> {peak // MiB}", outcomes={o: outcomes.count(o) for o in set(outcomes)},
    )  # fmt: skip
    # The calls the gateway read are held by the stand-in (its budget's worth); every other call ended with a status
    # that says why: the gateway's OVERLOADED (its budget), or Envoy's own with a reason; never a reset (INTERNAL),
    # never a status without an ErrorInfo.
    budget = load_settings(GatewaySettings, environ={}).http_max_body_budget_bytes
    assert outcomes.count("running") <= budget // 16_000_000, outcomes
    refused = [outcome for outcome in outcomes if outcome not in ("OK", "running")]
    assert refused and all(o.split()[0] in ("RESOURCE_EXHAUSTED", "UNAVAILABLE") for o in refused), outcomes
    assert all(o.split()[1] == "OVERLOADED" for o in refused), outcomes
    # The messages waited in flow control, not in Envoy's heap: the overload manager never had to act.
    assert peak < ACTS_FROM, f"Envoy's heap {idle // MiB} -> {peak // MiB} MiB"


def test_a_small_native_call_is_answered_after_the_attack(edge) -> None:
    port, _ = edge
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = channel.unary_unary(ENCODE)(
            inference_pb2.EncodeRequest(model=QUICK_MODEL).SerializeToString(), timeout=30
        )
    assert inference_pb2.EncodeResponse.FromString(answer).model == QUICK_MODEL


def stat(admin_port: int, name: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/stats?filter=^{name}$&format=json", timeout=5) as reply:
        return int(json.loads(reply.read())["stats"][0]["value"])


def test_envoy_refusing_new_requests_tells_native_callers_why(tmp_path) -> None:
    """Past 95% of its heap limit Envoy refuses new requests before its filters run: a native gRPC caller got
    UNAVAILABLE with the HTTP callers' JSON body as its message and no ErrorInfo; now the reason (OVERLOADED) and a
    retry delay, as the services give them; HTTP callers keep the JSON 503. An Envoy whose heap limit is below its idle
    heap refuses every request."""
    port, admin_port = free_port(), free_port()
    nowhere = f"127.0.0.1:{free_port()}"
    config = render(listen_port=port, admin_port=admin_port, gateway=nowhere, config=nowhere)
    (monitor,) = [m for m in config["overload_manager"]["resource_monitors"] if m["name"].endswith("fixed_heap")]
    monitor["typed_config"]["max_heap_size_bytes"] = MiB
    (tmp_path / "envoy.json").write_text(json.dumps(config))
    envoy = EnvoyProcess(tmp_path / "envoy.json", tmp_path / "envoy.log", admin_port)
    try:
        envoy.wait_ready()
        active = "overload.envoy.overload_actions.stop_accepting_requests.active"
        wait_until(lambda: stat(admin_port, active) == 1, what="Envoy overloaded")
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.RpcError) as raised:
                channel.unary_unary(ENCODE)(inference_pb2.EncodeRequest(model="m").SerializeToString(), timeout=10)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/encode/m", b'{"items": []}', method="POST")
        request.add_header("content-type", "application/json")
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(request, timeout=10)
    finally:
        envoy.stop()
    error = raised.value
    assert error.code() == grpc.StatusCode.UNAVAILABLE, error
    assert (error_reason(error), retry_delay_s(error)) == ("OVERLOADED", 1.0)
    assert "memory limit" in error.details()
    body = json.loads(http.value.read())
    assert (http.value.code, body["details"][0]["reason"]) == (503, "OVERLOADED")
