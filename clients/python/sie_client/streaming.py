"""Long lists sent as several requests, a window of them in flight, answered in order: encode's over one
EncodeStream (each request retried on its own), extract's as concurrent unary calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TypeVar

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_client.progress import Progress
from sie_client.retry import Metadata, RetryPolicy, delay_or_raise
from sie_client.status import CallSite, DeliveredStatus, explained, status_from_proto

T = TypeVar("T")


async def encode_streamed(
    stub: inference_pb2_grpc.InferenceStub,
    requests: list[inference_pb2.EncodeRequest],
    policy: RetryPolicy,
    *,
    window: int,
    site: CallSite,
    progress: Progress,
    metadata: Metadata,
) -> list[inference_pb2.EncodeResponse]:
    """Send the requests over one EncodeStream, `window` in flight, and return the answers in order.

    The stream has no deadline (a long list takes as long as it takes), but each answer does: `site.timeout_s` (the
    client's read_timeout_s) after the previous one, or after the last retry is due; a server that stops answering is
    not waited on for ever."""
    outgoing: asyncio.Queue[inference_pb2.EncodeRequest | None] = asyncio.Queue()
    slots = asyncio.Semaphore(window)
    answers: list[inference_pb2.EncodeResponse | None] = [None] * len(requests)
    attempts = [0] * len(requests)
    loop = asyncio.get_running_loop()
    started = time.monotonic()  # as delay_or_raise measures

    async def stream_requests() -> AsyncIterator[inference_pb2.EncodeStreamRequest]:
        while (request := await outgoing.get()) is not None:
            yield inference_pb2.EncodeStreamRequest(request=request)

    async def feed() -> None:
        for index, request in enumerate(requests):
            await slots.acquire()
            request.request_id = str(index)
            outgoing.put_nowait(request)

    call = stub.EncodeStream(stream_requests(), metadata=metadata)
    delivered = DeliveredStatus(call)
    feeder = asyncio.create_task(feed())
    remaining = len(requests)
    retries_due = loop.time()
    try:
        while True:
            wait_s = site.timeout_s + max(0.0, retries_due - loop.time())
            try:
                async with asyncio.timeout(wait_s):
                    answer = await call.read()
            except TimeoutError:
                raise site.timed_out(f"in {wait_s:.1f} s with {remaining} requests outstanding").error() from None
            if answer is grpc.aio.EOF:
                break
            index = int(answer.request_id)
            if answer.WhichOneof("outcome") == "error":
                attempts[index] += 1
                delay = delay_or_raise(status_from_proto(answer.error), policy, attempts[index], started, site)
                loop.call_later(delay, outgoing.put_nowait, requests[index])
                retries_due = max(retries_due, loop.time() + delay)
                continue
            answers[index] = answer.response
            slots.release()
            remaining -= 1
            progress.advance(len(answer.response.results))
            if remaining == 0:
                outgoing.put_nowait(None)
    except grpc.aio.AioRpcError as error:
        raise explained(await delivered.of(error), site).error() from None
    finally:
        feeder.cancel()
        outgoing.put_nowait(None)  # ends stream_requests, and so grpc's task that reads it (else left pending)
        call.cancel()
    return [answer for answer in answers if answer is not None]


async def in_windows(calls: Sequence[Awaitable[T]], window: int) -> list[T]:
    """Await the calls, `window` at a time, and return their answers in order. The first failure is the whole call's:
    the other calls are cancelled, not left running."""
    slots = asyncio.Semaphore(window)

    async def one(call: Awaitable[T]) -> T:
        async with slots:
            return await call

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
