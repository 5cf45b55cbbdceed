"""Serving EncodeStream, the same on a worker and on the gateway.

Each request runs as soon as it is read and is answered when it completes,
tagged with its request_id. A stream's requests all carry a request_id or none
do, as its first request does: without, each is tagged with its 0-based
position on the stream; a request that breaks the rule is refused
(INVALID_ARGUMENT MIXED_REQUEST_IDS, tagged "", which no other answer is), so no
two answers share a tag by accident (an explicit "1" and the request at
position 1). A failed request is answered with its status; the stream goes on.

At most `encode_stream_window` requests of one stream run or wait for the
caller to read their answers; meanwhile no more are read, so a caller that
does not read its answers is held back by flow control instead of growing the
server. At most `max_encode_streams` streams are open in one process at once
(each may hold a window of answers); one more is refused with
RESOURCE_EXHAUSTED TOO_MANY_STREAMS.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
from google.rpc import status_pb2

from sie.v1 import inference_pb2
from sie_common.edge.concurrent_answers import ConcurrentAnswers
from sie_common.edge.errors import InvalidArgument, ResourceExhausted, SieError, abort, clipped
from sie_common.runtime.settings import setting

# Answers one request: its response, or the status it failed with (or raises SieError).
Encode = Callable[[inference_pb2.EncodeRequest], Awaitable[inference_pb2.EncodeResponse | status_pb2.Status]]


@dataclass(frozen=True)
class EncodeStreamSettings:
    """The EncodeStream bounds of a service that serves it (worker, gateway)."""

    encode_stream_window: int = setting(
        32,
        env="SIE_ENCODE_STREAM_WINDOW",
        help="requests of one EncodeStream running or answered and not yet read by the caller; while that many are, "
        "no more of its requests are read (flow control holds the caller back)",
    )
    max_encode_streams: int = setting(
        64,
        env="SIE_MAX_ENCODE_STREAMS",
        help="EncodeStreams open at once in this process (each holds up to SIE_ENCODE_STREAM_WINDOW answers); one "
        "more is refused with RESOURCE_EXHAUSTED TOO_MANY_STREAMS",
    )


class EncodeStreams:
    """The EncodeStreams one process serves: at most `settings.max_encode_streams` open at once."""

    def __init__(self, settings: EncodeStreamSettings) -> None:
        self._window = settings.encode_stream_window
        self._limit = settings.max_encode_streams
        self.open = 0

    async def serve(
        self,
        requests: AsyncIterator[inference_pb2.EncodeStreamRequest],
        encode: Encode,
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        if self.open >= self._limit:
            await abort(
                context,
                ResourceExhausted(
                    f"this server has {self.open} EncodeStreams open, its limit (SIE_MAX_ENCODE_STREAMS); close one, "
                    "or send these requests on a stream already open, or retry later",
                    reason="TOO_MANY_STREAMS",
                    metadata={"limit": str(self._limit)},
                ),
            )
        self.open += 1
        # The call's end, however it ends (a caller that goes away included), frees its place. (grpc-stubs types
        # the callback as a class nothing can be an instance of.)
        context.add_done_callback(lambda _: self._closed())  # type: ignore[arg-type]
        async for response in serve_encode_stream(requests, encode, self._window):
            yield response

    def _closed(self) -> None:
        self.open -= 1


async def serve_encode_stream(
    requests: AsyncIterator[inference_pb2.EncodeStreamRequest], encode: Encode, window: int
) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
    answers: ConcurrentAnswers[inference_pb2.EncodeStreamResponse] = ConcurrentAnswers(limit=window)

    async def answer(request: inference_pb2.EncodeRequest) -> inference_pb2.EncodeStreamResponse:
        try:
            outcome = await encode(request)
        except SieError as error:
            outcome = error.to_status()
        if isinstance(outcome, status_pb2.Status):
            return inference_pb2.EncodeStreamResponse(request_id=request.request_id, error=outcome)
        return inference_pb2.EncodeStreamResponse(request_id=request.request_id, response=outcome)

    def refuse(error: SieError, request_id: str) -> None:
        answers.reply(inference_pb2.EncodeStreamResponse(request_id=request_id, error=error.to_status()))

    async def feed() -> None:
        position = 0
        named: bool | None = None  # whether this stream's requests carry a request_id: its first one decides
        await answers.room()
        async for message in requests:
            request = message.request
            if named is None:
                named = bool(request.request_id)
            if bool(request.request_id) != named:
                refuse(_mixed(request.request_id, position), "")
            else:
                if not named:
                    request.request_id = str(position)
                if not answers.start(request.request_id, answer(request)):
                    refuse(
                        InvalidArgument(
                            f"request_id {clipped(request.request_id)!r} is already in flight on this stream",
                            reason="DUPLICATE_REQUEST_ID",
                        ),
                        request.request_id,
                    )
            position += 1
            await answers.room()

    async for response in answers.stream(feed()):
        yield response


def _mixed(request_id: str, position: int) -> InvalidArgument:
    if request_id:
        problem = (
            f"request_id {clipped(request_id)!r} (position {position}): this stream's first request had no "
            "request_id, so its requests are tagged by position"
        )
    else:
        problem = f"the request at position {position} has no request_id, and this stream's first request had one"
    return InvalidArgument(
        f"{problem}; a stream's requests all carry a request_id or none do, so that no two answers share a tag: "
        "send this request with the stream's convention, or on another stream",
        reason="MIXED_REQUEST_IDS",
        metadata={"position": str(position)},
    )
