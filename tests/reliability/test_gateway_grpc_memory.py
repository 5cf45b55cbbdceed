"""The gateway's memory under many large gRPC messages at once is bounded by its request budget, however many are sent
(issue 32: one client sending 16,000,000-byte Encodes on 16 channels, 4 at a time on each, took a gateway to 1,648 MiB
although 52 of the 64 were refused: grpc had received each whole message before the budget saw it).

The gateway's interceptors and server options over the stand-in servicer of test_gateway_grpc_budget (which holds each
request it gets, parsed and serialized, until the end) in a process of their own, so that its memory is its own;
meanwhile another caller's small calls are answered. From tests/,
`python -m reliability.test_gateway_grpc_memory CHANNELS CALLS CALLERS [ENVOY_DIR]` prints the same measurement."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import psutil
import pytest

from reliability.test_gateway_grpc_budget import (
    COST_PER_BYTE,
    QUICK_MODEL,
    encode_request,
    from_address,
    refusals_of,
    serving,
)
from sie.v1 import inference_pb2
from sie_common.runtime.settings import load_settings
from sie_gateway.settings import GatewaySettings
from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess, free_port

MiB = 2**20
ATTACK_MESSAGE_BYTES = 16_000_000
ENCODE = "/sie.v1.Inference/Encode"
# The gateway's refusal, and Envoy's own when its overload manager acts (503 EDGE_ERROR, or the stream reset).
ENVOY_REFUSALS = ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL")


@pytest.mark.process
@pytest.mark.parametrize(
    ("channels", "calls_per_channel", "callers", "via_envoy"), [(16, 4, 1, False), (16, 4, 16, False), (16, 4, 1, True)]
)
def test_large_messages_on_many_channels_cost_at_most_the_budget(
    channels: int, calls_per_channel: int, callers: int, via_envoy: bool, tmp_path: Path
) -> None:
    """One client's share full, or (each channel naming a client of its own) the whole budget; straight to the
    gateway's port, or through Envoy (which names the client, 127.0.0.1, over whatever it sent)."""
    result = asyncio.run(attack(channels, calls_per_channel, callers, tmp_path if via_envoy else None))
    settings = load_settings(GatewaySettings, environ={})
    budget = settings.http_max_body_budget_bytes
    # What was read fits the budget, the rest was refused unread, and memory grew by at most the budget's cost.
    assert 0 < result["admitted"] * result["message"] <= budget, result
    if via_envoy:  # Envoy's overload manager may also refuse or reset some, under its own memory bound
        assert {refusal.split()[0] for refusal in result["refusals"]} <= set(ENVOY_REFUSALS), result
    else:
        assert set(result["refusals"]) == {"RESOURCE_EXHAUSTED OVERLOADED"}, result
    assert result["grown"] <= budget * COST_PER_BYTE, result
    # Another caller's small calls were answered all along while one client filled its share; while many filled the
    # whole budget (or through Envoy, where they come from the same client), answered or refused OVERLOADED (no room
    # for one more message), never left hanging.
    assert result["quick_answered"] + result["quick_refused"] == result["quick_calls"] > 0, result
    if callers == 1 and not via_envoy:
        assert result["quick_answered"] == result["quick_calls"], result


async def attack(channels: int, calls_per_channel: int, callers: int, envoy_dir: Path | None) -> dict[str, object]:
    """`channels` channels from `callers` clients, each sending `calls_per_channel` 16,000,000-byte Encode messages at
    once to the stand-in gateway in a process of its own, while another client sends small calls one after another: the
    gateway's growth at its peak, how many large calls it read and what the others were answered. With `envoy_dir`,
    through an Envoy of the local stack's configuration (its files there) in front of it."""
    tests = str(Path(__file__).parents[1])
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "reliability.test_gateway_grpc_memory", "serve", str(port)],
        env=environ,
        stdout=subprocess.PIPE,
    )
    envoy = None
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == b"serving"
        if envoy_dir is not None:
            envoy, port = start_envoy(envoy_dir, gateway=f"127.0.0.1:{port}")
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
                    # Refused by the budget, or through Envoy by its overload manager (a busy fresh-clone run).
                    if error.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE):
                        raise
                    quick_refused += 1
                await asyncio.sleep(0.05)
                peak = max(peak, gateway.memory_info().rss)
                settled = settled + 0.05 if sum(call.done() for call in calls) == done else 0.0
            refusals = await refusals_of(calls)
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
        if envoy is not None:
            envoy.stop()
        server.kill()
        server.wait()


def start_envoy(directory: Path, gateway: str) -> tuple[EnvoyProcess, int]:
    """Envoy with the local stack's configuration in front of `gateway`, ready; and its port."""
    port, admin_port = free_port(), free_port()
    config = directory / "envoy.json"
    config.write_text(json.dumps(render(listen_port=port, admin_port=admin_port, gateway=gateway, config=gateway)))
    envoy = EnvoyProcess(config, directory / "envoy.log", admin_port)
    envoy.wait_ready()
    return envoy, port


async def serve_forever(port: int) -> None:
    async with serving({}, port=port):
        print("serving", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        asyncio.run(serve_forever(int(sys.argv[2])))
    else:
        envoy_dir = Path(sys.argv[4]) if len(sys.argv) > 4 else None  # a directory: through Envoy
        result = asyncio.run(attack(*map(int, sys.argv[1:4]), envoy_dir))
        refusals = collections.Counter(result.pop("refusals"))  # type: ignore[arg-type]
        print(json.dumps({**result, "refusals": refusals}))
