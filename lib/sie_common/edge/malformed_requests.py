"""Requests that are not valid protobuf (bad bytes, strings that are not UTF-8) get INVALID_ARGUMENT.

grpc parses a request before the handler runs and answers a parse failure
with UNKNOWN; this interceptor takes the parsing over for the engine's own
services (sie.v1), so the caller learns what was wrong with what it sent.
Its handlers end holding nothing of their calls (EndWithoutFrames): a refused
request is freed when its call ends, not at the next full garbage collection.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc

from sie_common.edge.ended_calls import EndWithoutFrames, close_requests
from sie_common.edge.errors import InvalidArgument, abort

OWN_SERVICES = "/sie.v1."

Decode = Callable[[bytes], Any]
Continuation = Callable[[grpc.HandlerCallDetails], Awaitable["grpc.RpcMethodHandler[Any, Any] | None"]]
# grpc.aio's behaviours are coroutine functions (stream ones async generators); types-grpcio types RpcMethodHandler's
# attributes as grpc's synchronous ones.
UnaryBehaviour = Callable[[Any, grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
StreamBehaviour = Callable[[AsyncIterator[Any], grpc.aio.ServicerContext[Any, Any]], AsyncIterator[Any]]


class RejectMalformedRequests(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler.request_deserializer is None
            or not handler_call_details.method.startswith(OWN_SERVICES)
        ):
            return handler
        decode = handler.request_deserializer
        if handler.unary_unary is not None:
            behaviour = cast(UnaryBehaviour, handler.unary_unary)

            async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                with EndWithoutFrames():
                    return await behaviour(await _decoded(decode, raw, context), context)
                return None

            return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=handler.response_serializer)
        if handler.stream_stream is not None:
            streaming = cast(StreamBehaviour, handler.stream_stream)

            async def stream_stream(
                raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                async def requests() -> AsyncIterator[Any]:
                    async for raw in raw_requests:
                        yield await _decoded(decode, raw, context)

                try:
                    with EndWithoutFrames():
                        async for response in streaming(requests(), context):
                            yield response
                finally:
                    await close_requests(raw_requests)

            return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=handler.response_serializer)
        return handler


async def _decoded(decode: Decode, raw: bytes, context: grpc.aio.ServicerContext) -> Any:
    try:
        return decode(raw)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError, or whatever a custom deserializer raises
        message_type = getattr(getattr(decode, "__self__", None), "DESCRIPTOR", None)
        name = message_type.full_name if message_type is not None else "request message"
        await abort(
            context,
            InvalidArgument(
                f"the request is not a valid {name} ({error}); send a serialized {name}", reason="MALFORMED_REQUEST"
            ),
        )
