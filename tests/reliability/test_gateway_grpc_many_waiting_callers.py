"""Many callers whose calls wait for room in the request budget cost the gateway no CPU while they wait (issue 32
attack: the oldest waiting read of every caller looked again every 50 ms; 9,000 calls that never sent their message,
from 3,000 client addresses, kept the gateway's event loop busy with those timers, so grpc took calls up so slowly that
6,147 of them came back CANCELLED instead of RESOURCE_EXHAUSTED past MAX_WAITING_READS, and a small Encode from another
client waited 40 s for DEADLINE_EXCEEDED). Now one timer looks again for all of them, and room freed goes to each
caller's oldest read in turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from grpc_helpers import error_reason
from reliability.test_gateway_grpc_budget import SMALL_BUDGET, encode_request, from_address, serving, until
from sie_gateway import request_budget

CALLERS = 1500
ENCODE = "/sie.v1.Inference/Encode"


async def never_sent() -> AsyncIterator[bytes]:
    """A request stream whose one message never comes (the call's headers only)."""
    await asyncio.sleep(3600)
    yield b""


async def test_calls_of_many_callers_waiting_for_room_cost_no_cpu_and_the_rest_are_refused_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(request_budget, "MAX_WAITING_READS", CALLERS)
    # The stalled reads keep their room throughout (dropping them for the waiting ones is test_gateway_grpc_stalled_*).
    async with serving({**SMALL_BUDGET, "SIE_GATEWAY_GRPC_READ_EVICT_AFTER_S": "600"}) as (channel, servicer, budget):
        call = channel.stream_unary(ENCODE)
        # 4 reads fill the budget (8 MiB, 2 MiB each), the other calls wait: one per caller.
        stalled = [call(never_sent(), metadata=from_address(f"10.5.{n // 250}.{n % 250}")) for n in range(CALLERS + 4)]
        await until(lambda: budget.held == 8 * 2**20, timeout_s=30)  # the reads in progress
        await asyncio.sleep(0.5)  # the last calls reach their queues
        started, cpu = time.monotonic(), time.process_time()
        await asyncio.sleep(2.0)
        busy = (time.process_time() - cpu) / (time.monotonic() - started)
        # Before: each of 1,500 callers' oldest read woke every 50 ms (30,000 wake-ups a second; a whole core).
        assert busy < 0.15, f"the gateway's loop was busy {busy:.0%} of the time with calls that only wait"
        # Past MAX_WAITING_READS a call is refused at once (its caller is new: it does not wait either).
        late = channel.unary_unary(ENCODE)
        begun = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await late(encode_request(1000).SerializeToString(), metadata=from_address("10.6.0.1"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(caught.value) == "OVERLOADED"
        assert "calls of all callers' already wait" in caught.value.details()
        assert time.monotonic() - begun < 2.0
        assert servicer.entered == 0
        for waiting in stalled:
            waiting.cancel()
        await until(lambda: budget.held == 0)
