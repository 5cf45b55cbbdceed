"""Serving EncodeStream, the same on a worker and on the gateway.

Each request runs as soon as it is read and is answered when it completes,
tagged with its request_id (a request without one gets its 0-based position
on the stream). A failed request is answered with its status; the stream goes on.
At most `window` requests of one stream run or wait for the caller to read
their answers; meanwhile no more are read, so a caller that does not read its
answers is held back by flow control instead of growing the server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from google.rpc import status_pb2

from sie.v1 import inference_pb2
from sie_common.edge.concurrent_answers import ConcurrentAnswers
from sie_common.edge.errors import InvalidArgument, SieError

# Answers one request: its response, or the status it failed with (or raises SieError).
Encode = Callable[[inference_pb2.EncodeRequest], Awaitable[inference_pb2.EncodeResponse | status_pb2.Status]]


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

    async def feed() -> None:
        ordinal = 0
        await answers.room()
        async for message in requests:
            request = message.request
            if not request.request_id:
                request.request_id = str(ordinal)
            ordinal += 1
            if not answers.start(request.request_id, answer(request)):
                duplicate = InvalidArgument(
                    f"request_id {request.request_id!r} is already in flight on this stream",
                    reason="DUPLICATE_REQUEST_ID",
                )
                answers.reply(
                    inference_pb2.EncodeStreamResponse(request_id=request.request_id, error=duplicate.to_status())
                )
            await answers.room()

    async for response in answers.stream(feed()):
        yield response
