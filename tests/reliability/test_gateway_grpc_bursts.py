"""Many tiny calls at once on one channel are all answered (issue 32: 376 and 702 of 3,000 came back CANCELLED well
within their deadline). grpc's server cancelled calls at random once more than 1,000 waited to be taken up by its
handlers; ServerTransport.server_options raises that backlog to MAX_PENDING_CALLS."""

from __future__ import annotations

import asyncio
import collections

import grpc

from reliability.test_gateway_grpc_budget import QUICK_MODEL, serving
from sie.v1 import inference_pb2

BURST = 3000


async def test_three_thousand_tiny_calls_at_once_on_one_channel_are_all_answered() -> None:
    async with serving({}) as (channel, _, budget):
        encode = channel.unary_unary("/sie.v1.Inference/Encode", response_deserializer=bytes)
        tiny = inference_pb2.EncodeRequest(model=QUICK_MODEL).SerializeToString()

        async def outcome() -> str:
            try:
                answer = inference_pb2.EncodeResponse.FromString(await encode(tiny, timeout=120))
            except grpc.aio.AioRpcError as error:
                return f"{error.code().name} {error.details()}"
            return answer.model

        outcomes = collections.Counter(await asyncio.gather(*(outcome() for _ in range(BURST))))
        assert outcomes == {QUICK_MODEL: BURST}
        assert budget.held == 0
