"""What a gRPC handler lets go of when its call ends, so that the call's request is freed then and not at the next
full garbage collection (rare in a long-lived process): each refused 15 MiB Encode kept about 46 MB of a gateway
until then (issue 32)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import grpc


class EndWithoutFrames:
    """Around a gRPC handler's work: once the call ends, nothing holds the frames it ran in.

    grpc keeps the AbortError that context.abort raised for as long as the call's state lives, and its traceback
    keeps the frames it passed through with their locals (the request, its bytes, their copies); those frames hold
    the call's context, which holds that state: a cycle. So the tracebacks of an abort, and of the exceptions it
    chains, are dropped and the abort is kept from going further: grpc raises it again itself once the handler
    returns, and the caller gets the status the abort sent. A cancellation's tracebacks are dropped as it goes on."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> bool:
        if isinstance(error, grpc.aio.AbortError | asyncio.CancelledError):
            forget_tracebacks(error)
        return isinstance(error, grpc.aio.AbortError)


def forget_tracebacks(error: BaseException) -> None:
    """Drop the tracebacks of `error` and of the exceptions it chains (its cause and context), which keep the frames
    they passed through alive."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        current.__traceback__ = None
        pending += [current.__cause__, current.__context__]


async def only_message(messages: AsyncIterator[bytes]) -> bytes | None:
    """A unary call's message (None if it ended without one), its request stream then closed (close_requests)."""
    try:
        return await anext(aiter(messages), None)
    finally:
        await close_requests(messages)


async def close_requests(messages: AsyncIterator[object]) -> None:
    """Close a call's request stream: grpc's receiver keeps the last message it gave in a reference cycle (its
    generator's frame) until the stream ends, which a call refused or cancelled mid-stream never lets it do. A stream
    a read is still in (an EncodeStream's reader task, cancelled but not yet ended) ends with that read."""
    stream = aiter(messages)
    if isinstance(stream, AsyncGenerator) and not getattr(stream, "ag_running", False):
        await stream.aclose()
