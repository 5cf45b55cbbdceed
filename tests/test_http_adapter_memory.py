"""What the HTTP adapter's body budget costs the gateway in memory. A body in flight is held several times over: its
bytes, decoded, as the contract's message, and the gateway's own copy of that message, about 7 times its size in
all. With the budget at 256 MiB, 16 callers without a token each sending one 14 MB body at once took a gateway from
107 MB to 1.29 GB (issue 32, attack round 5), past the 1 GiB the Kubernetes base gives it: anyone could have it killed,
and every call in it lost. The default budget now keeps what it admits within that limit.

In a process of its own (so its memory is its own), over the stand-in gateway (http_adapter_in_process.py), with the
adapter's default bounds."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import psutil
import pytest

from http_adapter_in_process import JSON, RERANK, Gateway, MiB, running_adapter
from sie_common.edge.auth import CLIENT_ADDRESS_HEADER
from sie_common.runtime.settings import load_settings
from sie_gateway.settings import GatewaySettings

# Runs the adapter in a process of its own.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
CALLERS = 12
# What one body in flight may cost the gateway, as a multiple of its bytes (measured: about 7).
COST_PER_BODY_BYTE = 8
# The gateway's own memory besides the bodies (its code, the mirror, the channels).
GATEWAY_BASE = 256 * MiB


def kubernetes_memory_limit() -> int:
    text = (ROOT / "deploy/kustomize/base/gateway.yaml").read_text()
    (limit,) = re.findall(r"limits: \{memory: (\d+)Gi\}", text)
    return int(limit) * 2**30


def test_the_default_budget_fits_the_gateways_memory_limit() -> None:
    settings = load_settings(GatewaySettings, environ={})
    assert settings.http_max_body_budget_bytes * COST_PER_BODY_BYTE + GATEWAY_BASE <= kubernetes_memory_limit()


def test_callers_without_tokens_sending_large_bodies_at_once_stay_within_the_budgets_cost() -> None:
    run = subprocess.run(
        [sys.executable, __file__], check=False, cwd=Path(__file__).parent, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    budget = load_settings(GatewaySettings, environ={}).http_max_body_budget_bytes
    assert 0 < result["admitted"] < CALLERS, result
    assert result["admitted"] * result["body"] <= budget, result
    assert all(status in (200, 503) for status in result["statuses"]), result
    assert result["grown"] <= budget * COST_PER_BODY_BYTE, result


async def scenario() -> dict:
    """CALLERS bodies of about 14.5 MB, each from its own address, at once, while the gateway holds every call."""
    gateway = Gateway()
    gateway.hold = True
    body = json.dumps({**RERANK, "documents": ["x" * 1900] * 8000}).encode()
    process = psutil.Process()
    before = process.memory_info().rss
    peak = before

    async with running_adapter(gateway) as url, aiohttp.ClientSession() as session:

        async def send(n: int) -> int:
            headers = {**JSON, CLIENT_ADDRESS_HEADER: f"10.0.0.{n}"}
            async with session.post(url + "/v1/rerank", data=body, headers=headers) as response:
                await response.read()
                return response.status

        calls = [asyncio.create_task(send(n)) for n in range(CALLERS)]
        for _ in range(600):
            peak = max(peak, process.memory_info().rss)
            refused = sum(call.done() for call in calls)
            if refused + len(gateway.scores) == CALLERS:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        peak = max(peak, process.memory_info().rss)
        admitted = len(gateway.scores)
        gateway.release.set()
        statuses = await asyncio.gather(*calls)
    return {"admitted": admitted, "body": len(body), "grown": peak - before, "statuses": statuses}


def main() -> None:
    # The stand-in gateway takes what the real one does (its SIE_MAX_RECEIVE_MESSAGE_BYTES).
    server = grpc.aio.server
    grpc.aio.server = lambda *args, **kwargs: server(  # type: ignore[assignment]
        *args, options=[("grpc.max_receive_message_length", 16 * MiB)], **kwargs
    )
    print(json.dumps(asyncio.run(scenario())))


if __name__ == "__main__":
    main()
