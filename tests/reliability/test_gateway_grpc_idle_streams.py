"""EncodeStreams that wait for a message that never comes cannot hold the request budget against other callers: a
read still awaited SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S after it began gives its room up when another message needs it
(its stream ends UNAVAILABLE/OVERLOADED, retryable), and a call whose caller goes away while it waits for room holds
nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from grpc_helpers import error_reason, retry_delay_s
from reliability.test_gateway_grpc_budget import (
    LARGEST,
    QUICK_MODEL,
    SMALL_BUDGET,
    encode_request,
    from_address,
    serving,
    until,
)
from sie.v1 import inference_pb2, inference_pb2_grpc

MiB = 2**20
EVICT_AFTER_S = 1.0
BUDGET = {**SMALL_BUDGET, "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S": str(EVICT_AFTER_S)}


async def test_idle_streams_give_their_room_up_to_a_message_that_needs_it() -> None:
    async with serving(BUDGET) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        # Idle streams from callers of their own: each awaits a message holding room for the largest, until the
        # budget has room for just one more read.
        idle = [stub.EncodeStream(metadata=from_address(f"10.0.0.{n}")) for n in range(5)]
        await until(lambda: budget.held == 8 * MiB - LARGEST)
        # Two unary calls from another caller, held until the end: one fits now, the other needs the room an idle
        # stream holds.
        started = time.monotonic()
        calls = [stub.Encode(encode_request(MiB), metadata=from_address("10.0.1.1"), timeout=30) for _ in range(2)]
        await until(lambda: servicer.entered == 2, timeout_s=EVICT_AFTER_S + 5)
        assert time.monotonic() - started >= EVICT_AFTER_S * 0.9
        ended = [call for call in idle if call.done()]
        assert ended
        for call in ended:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call.read()
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert error_reason(caught.value) == "OVERLOADED" and retry_delay_s(caught.value) == 1.0
        servicer.release.set()
        for call in calls:
            await call
        for call in idle:
            call.cancel()
        await until(lambda: budget.held == 0)


async def test_a_call_cancelled_while_it_waits_for_room_holds_nothing() -> None:
    async with serving(BUDGET) as (channel, servicer, budget):
        stub = inference_pb2_grpc.InferenceStub(channel)
        held = stub.Encode(encode_request(MiB), metadata=from_address("10.0.0.1"))
        await until(lambda: servicer.entered == 1)
        # An idle stream of the same caller holds the rest of its share: the next call waits for room.
        stream = stub.EncodeStream(metadata=from_address("10.0.0.1"))
        await until(lambda: budget.held_by("address 10.0.0.1") > MiB + LARGEST - 1)
        waiting = stub.Encode(encode_request(64 * 1024), metadata=from_address("10.0.0.1"))
        await asyncio.sleep(0.3)
        assert not waiting.done()
        waiting.cancel()
        stream.cancel()
        await until(lambda: budget.held_by("address 10.0.0.1") == held_bytes(servicer))
        servicer.release.set()
        await held
        await until(lambda: budget.held == 0)


def held_bytes(servicer: object) -> int:
    return sum(len(serialized) for _, serialized in servicer.held)  # type: ignore[attr-defined]


async def test_a_unary_message_that_never_comes_times_out_holding_nothing() -> None:
    async with serving({**BUDGET, "SIE_GATEWAY_HTTP_BODY_TIMEOUT_S": "1"}) as (channel, servicer, budget):

        async def nothing() -> AsyncIterator[bytes]:
            await asyncio.Event().wait()
            yield b""

        # Encode called as a client stream that never sends its message (and never half-closes).
        silent = channel.stream_unary("/sie.v1.Inference/Encode")(nothing(), metadata=from_address("10.0.0.1"))
        await until(lambda: budget.held == LARGEST)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(silent, 10)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert error_reason(caught.value) == "REQUEST_TIMEOUT"
        assert "SIE_GATEWAY_HTTP_BODY_TIMEOUT_S" in caught.value.details()
        assert servicer.entered == 0
        await until(lambda: budget.held == 0)


async def test_a_unary_call_of_two_messages_is_answered_for_its_first() -> None:
    async with serving(BUDGET) as (channel, _, budget):

        async def two() -> AsyncIterator[bytes]:
            for model in (QUICK_MODEL, "other"):
                yield inference_pb2.EncodeRequest(model=model).SerializeToString()

        answer = await channel.stream_unary("/sie.v1.Inference/Encode")(two(), metadata=from_address("10.0.0.1"))
        assert inference_pb2.EncodeResponse.FromString(answer).model == QUICK_MODEL
        await until(lambda: budget.held == 0)
