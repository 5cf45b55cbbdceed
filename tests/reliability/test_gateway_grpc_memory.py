"""The gateway's memory under many large gRPC messages at once is bounded by its request budget, however many are sent
(issue 32: one client sending 16,000,000-byte Encodes on 16 channels, 4 at a time on each, took a gateway to 1,648 MiB
although 52 of the 64 were refused: grpc had received each whole message before the budget saw it).

The gateway's interceptors and server options over the stand-in servicer of test_gateway_grpc_budget (which holds each
request it gets, parsed and serialized, until the end) in a process of their own, so that its memory is its own;
meanwhile another caller's small calls are answered. From tests/,
`python -m reliability.test_gateway_grpc_memory CHANNELS CALLS CALLERS` prints the same measurement."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import pytest
from google.rpc import status_pb2

from reliability.test_gateway_grpc_budget import COST_PER_BYTE, QUICK_MODEL, encode_request, from_address, serving
from sie.v1 import inference_pb2
from sie_common.edge.errors import status_reason
from sie_common.runtime.settings import load_settings
from sie_gateway.settings import GatewaySettings
from sie_stack.processes import free_port

MiB = 2**20
ATTACK_MESSAGE_BYTES = 16_000_000
ENCODE = "/sie.v1.Inference/Encode"


@pytest.mark.process
@pytest.mark.parametrize(("channels", "calls_per_channel", "callers"), [(16, 4, 1), (16, 4, 16)])
def test_large_messages_on_many_channels_cost_at_most_the_budget(
    channels: int, calls_per_channel: int, callers: int
) -> None:
    """One client's share full, or (each channel naming a client of its own) the whole budget."""
    result = asyncio.run(attack(channels, calls_per_channel, callers))
    settings = load_settings(GatewaySettings, environ={})
    budget = settings.http_max_body_budget_bytes
    # What was read fits the budget, the rest was refused unread, and memory grew by at most the budget's cost.
    assert 0 < result["admitted"] * result["message"] <= budget, result
    assert set(result["refusals"]) == {"RESOURCE_EXHAUSTED OVERLOADED"}, result
    assert result["grown"] <= budget * COST_PER_BYTE, result
    # Another caller's small calls were answered all along while one client filled its share; while many filled the
    # whole budget, they were answered or refused OVERLOADED (no room for one more message), never left hanging.
    assert result["quick_answered"] + result["quick_refused"] == result["quick_calls"] > 0, result
    if callers == 1:
        assert result["quick_answered"] == result["quick_calls"], result


async def attack(channels: int, calls_per_channel: int, callers: int) -> dict[str, object]:
    """`channels` channels from `callers` clients, each sending `calls_per_channel` 16,000,000-byte Encode messages at
    once to the stand-in gateway in a process of its own, while another client sends small calls one after another: the
    gateway's growth at its peak, how many large calls it read and what the others were answered."""
    tests = str(Path(__file__).parents[1])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "reliability.test_gateway_grpc_memory", "serve", str(port)],
        env=environ,
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == b"serving"
        gateway = psutil.Process(server.pid)
        before = peak = gateway.memory_info().rss
        message = encode_request(ATTACK_MESSAGE_BYTES).SerializeToString()
        options = [("grpc.max_send_message_length", 64 * MiB)]
        links = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(channels)]
        quick_link = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            calls = [
                link.unary_unary(ENCODE)(message, metadata=from_address(f"10.0.1.{n % callers}"), timeout=120)
                for n, link in enumerate(links)
                for _ in range(calls_per_channel)
            ]
            quick = quick_link.unary_unary(ENCODE)
            small = inference_pb2.EncodeRequest(model=QUICK_MODEL).SerializeToString()
            quick_calls = quick_answered = quick_refused = 0
            settled = 0.0
            while settled < 2.0:  # until no large call has ended for 2 s
                done = sum(call.done() for call in calls)
                quick_calls += 1
                try:
                    quick_answered += bool(await quick(small, metadata=from_address("10.0.0.2"), timeout=10))
                except grpc.aio.AioRpcError as error:
                    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    quick_refused += 1
                await asyncio.sleep(0.05)
                peak = max(peak, gateway.memory_info().rss)
                settled = settled + 0.05 if sum(call.done() for call in calls) == done else 0.0
            refusals = []
            for call in calls:
                if not call.done():
                    call.cancel()
                    continue
                try:
                    await call
                except grpc.aio.AioRpcError as error:
                    status = status_pb2.Status.FromString(dict(error.trailing_metadata())["grpc-status-details-bin"])
                    refusals.append(f"{error.code().name} {status_reason(status)}")
        finally:
            for link in [*links, quick_link]:
                await link.close()
        return {
            "calls": len(calls),
            "admitted": len(calls) - len(refusals),
            "message": len(message),
            "grown": peak - before,
            "grown_mib": round((peak - before) / MiB),
            "refusals": refusals,
            "quick_calls": quick_calls,
            "quick_answered": quick_answered,
            "quick_refused": quick_refused,
        }
    finally:
        server.kill()
        server.wait()


async def serve_forever(port: int) -> None:
    async with serving({}, port=port):
        print("serving", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(serve_forever(int(sys.argv[2])))
    else:
        result = asyncio.run(attack(*map(int, sys.argv[1:4])))
        print(json.dumps({key: value for key, value in result.items() if key != "refusals"}))
