"""Long lists sent as several requests, a window of them in flight, answered in order: encode's over one
EncodeStream (each request retried on its own), extract's as concurrent unary calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, TypeVar

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_client.errors import ServerError
from sie_client.retry import Metadata, RetryPolicy, delay_or_raise
from sie_client.status import call_status, status_from_proto

T = TypeVar("T")


async def encode_streamed(
    stub: inference_pb2_grpc.InferenceStub,
    requests: list[inference_pb2.EncodeRequest],
    policy: RetryPolicy,
    *,
    window: int,
    timeout_s: float,
    progress: bool,
    metadata: Metadata,
) -> list[inference_pb2.EncodeResponse]:
    """Send the requests over one EncodeStream, `window` in flight, and return the answers in order.

    The stream has no deadline (a long list takes as long as it takes), but each answer does: `timeout_s` after the
    previous one, or after the last retry is due; a server that stops answering is not waited on for ever."""
    outgoing: asyncio.Queue[inference_pb2.EncodeRequest | None] = asyncio.Queue()
    slots = asyncio.Semaphore(window)
    answers: list[inference_pb2.EncodeResponse | None] = [None] * len(requests)
    attempts = [0] * len(requests)
    loop = asyncio.get_running_loop()
    started = time.monotonic()  # as delay_or_raise measures
    bar = _progress_bar(sum(len(r.items) for r in requests)) if progress else None

    async def stream_requests() -> AsyncIterator[inference_pb2.EncodeStreamRequest]:
        while (request := await outgoing.get()) is not None:
            yield inference_pb2.EncodeStreamRequest(request=request)

    async def feed() -> None:
        for index, request in enumerate(requests):
            await slots.acquire()
            request.request_id = str(index)
            outgoing.put_nowait(request)

    call = stub.EncodeStream(stream_requests(), metadata=metadata)
    feeder = asyncio.create_task(feed())
    remaining = len(requests)
    retries_due = loop.time()
    try:
        while True:
            wait_s = timeout_s + max(0.0, retries_due - loop.time())
            try:
                answer = await asyncio.wait_for(call.read(), wait_s)
            except TimeoutError:
                raise ServerError.from_status(
                    f"EncodeStream: no answer in {wait_s:.1f} s (timeout_s={timeout_s}) with {remaining} "
                    f"requests outstanding",
                    grpc_code=grpc.StatusCode.DEADLINE_EXCEEDED,
                ) from None
            if answer is grpc.aio.EOF:
                break
            index = int(answer.request_id)
            if answer.WhichOneof("outcome") == "error":
                attempts[index] += 1
                delay = delay_or_raise(status_from_proto(answer.error), policy, attempts[index], started)
                loop.call_later(delay, outgoing.put_nowait, requests[index])
                retries_due = max(retries_due, loop.time() + delay)
                continue
            answers[index] = answer.response
            slots.release()
            remaining -= 1
            if bar is not None:
                bar.update(len(answer.response.results))
            if remaining == 0:
                outgoing.put_nowait(None)
    except grpc.aio.AioRpcError as error:
        raise call_status(error).error() from None
    finally:
        feeder.cancel()
        call.cancel()
        if bar is not None:
            bar.close()
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


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="item", desc="encode")
