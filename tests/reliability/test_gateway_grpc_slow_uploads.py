"""A large message that arrives slowly but steadily is not dropped for reads that would have had room a moment later
(issue 32's outside attack: a caller's 15 MiB Encode arriving at 5 MiB/s, with 2 small calls of its own at a time, was
dropped UNAVAILABLE OVERLOADED about 1 s in, on each of 6 tries, although the budget held nothing but the small
calls' passing reads: each read holds room for the largest message while it arrives, and a read that found none
dropped the slow one at once). A read drops stalled reads for its room only once it has waited
request_budget.EVICT_AFTER_WAITING_S; small reads end and give their room back before that.

In-process: the gateway's interceptors over the stand-in servicer of test_gateway_grpc_budget, with its small budget
(8 MiB, 4 MiB a caller, 2 MiB a read: a caller's share holds 2 reads), the slow caller's bytes through a throttling
proxy on loopback (a trusted proxy: the caller is the address it names)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

import grpc

from grpc_helpers import error_reason, items
from reliability.test_gateway_grpc_budget import QUICK_MODEL, SMALL_BUDGET, from_address, serving
from sie.v1 import inference_pb2
from sie_stack.processes import free_port

MiB = 2**20
ENCODE = "/sie.v1.Inference/Encode"
EVICT_AFTER_S = 0.5
RATE = MiB  # bytes a second of the slow caller: its 1.9 MiB message takes about 2 s, past EVICT_AFTER_S
CALLER = "10.1.0.1"


@contextlib.asynccontextmanager
async def throttled(port: int, rate: float) -> AsyncIterator[int]:
    """A loopback port whose bytes reach `port` at `rate` bytes a second (answers at once)."""

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limit: float | None) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(16384):
                writer.write(data)
                await writer.drain()
                if limit is not None:
                    await asyncio.sleep(len(data) / limit)
        writer.close()

    async def connection(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(forward(client_reader, server_writer, rate), forward(server_reader, client_writer, None))

    proxy = await asyncio.start_server(connection, "127.0.0.1", 0)
    try:
        yield proxy.sockets[0].getsockname()[1]
    finally:
        proxy.close()


async def test_a_slow_upload_is_not_dropped_for_its_callers_small_calls() -> None:
    port = free_port()
    environ = {**SMALL_BUDGET, "SIE_GATEWAY_GRPC_READ_EVICT_AFTER_S": str(EVICT_AFTER_S)}
    async with serving(environ, port=port) as (channel, _, _budget), throttled(port, RATE) as slow_port:
        large = inference_pb2.EncodeRequest(model=QUICK_MODEL, items=items(["x" * 1000] * 1900)).SerializeToString()
        small = inference_pb2.EncodeRequest(model=QUICK_MODEL).SerializeToString()
        answered: collections.Counter[str] = collections.Counter()
        uploading = True

        async def small_calls() -> None:
            while uploading:
                try:
                    await channel.unary_unary(ENCODE)(small, metadata=from_address(CALLER), timeout=20)
                    answered["OK"] += 1
                except grpc.aio.AioRpcError as error:
                    answered[f"{error.code().name} {error_reason(error)}"] += 1

        others = [asyncio.create_task(small_calls()) for _ in range(2)]
        outcomes = []
        async with grpc.aio.insecure_channel(
            f"127.0.0.1:{slow_port}", options=[("grpc.max_send_message_length", 4 * MiB)]
        ) as slow:
            for _ in range(2):
                try:
                    answer = await slow.unary_unary(ENCODE)(large, metadata=from_address(CALLER), timeout=30)
                    outcomes.append(inference_pb2.EncodeResponse.FromString(answer).model)
                except grpc.aio.AioRpcError as error:
                    outcomes.append(f"{error.code().name} {error_reason(error)}")
        uploading = False
        await asyncio.gather(*others)
        # Before: ['UNAVAILABLE OVERLOADED', 'UNAVAILABLE OVERLOADED'], each about EVICT_AFTER_S in.
        assert outcomes == [QUICK_MODEL, QUICK_MODEL]
        assert set(answered) == {"OK"} and answered["OK"] > 10, answered
