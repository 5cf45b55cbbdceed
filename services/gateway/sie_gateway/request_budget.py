"""The request bytes the gateway holds for its gRPC calls in flight, leased from the budget its HTTP adapter's bodies
take from (BodyBudget, SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES and its per-caller share), before a message is parsed.

A message held costs the gateway several times its bytes (the bytes, the parsed message, its merged copy, the
worker's request); without a bound, 16 callers sending 15.8 MB Encode messages at once took a gateway past the 1 GiB
the Kubernetes base gives it (issue 32). Each sie.v1.Inference message is charged to its caller (the bearer token
when the gateway checks tokens, else the connection's peer address and the client address Envoy writes in
x-sie-client-address) as its raw bytes arrive, and returned when the call ends, however it ends (answered, failed,
cancelled). An EncodeStream holds the bytes of as many of its messages as it has answers outstanding. A message that
does not fit is refused with RESOURCE_EXHAUSTED/OVERLOADED and a retry delay, unparsed. Calls on the adapter's own
Unix socket are not charged again: the adapter leased their bodies."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Any, cast

import grpc

from sie_common.edge.auth import (
    CLIENT_ADDRESS_HEADER,
    INFERENCE_CALLS,
    Authorize,
    Metadata,
    bearer_token,
    inference_checks,
)
from sie_common.edge.errors import ResourceExhausted, abort
from sie_common.edge.malformed_requests import (
    Continuation,
    RejectMalformedRequests,
    StreamBehaviour,
    UnaryBehaviour,
)
from sie_gateway.http_adapter.bodies import BodyBudget, BodyLease
from sie_gateway.http_adapter.errors import AdapterError
from sie_gateway.settings import GatewaySettings

RETRY_AFTER_S = 1.0


def intake_interceptors(settings: GatewaySettings, budget: BodyBudget) -> list[grpc.aio.ServerInterceptor]:
    """The gateway's gRPC interceptors, in order: the token check, then the lease of the message's bytes from
    `budget`, then parsing (INVALID_ARGUMENT for a malformed message)."""
    checks = inference_checks(settings.auth_mode, settings.auth_tokens)
    return [Authorize(checks), LeaseRequestBytes(budget, bool(checks)), RejectMalformedRequests()]


class LeaseRequestBytes(grpc.aio.ServerInterceptor):
    """Charge each sie.v1.Inference message's bytes to `budget` before it is parsed. List it before
    RejectMalformedRequests (whose handlers take the raw bytes), after Authorize (a caller refused for its token holds
    nothing); `checks_tokens`: whether Authorize checks tokens, so the token names the caller."""

    def __init__(self, budget: BodyBudget, checks_tokens: bool) -> None:
        self._budget = budget
        self._checks_tokens = checks_tokens

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        inference = handler_call_details.method.startswith(INFERENCE_CALLS)
        # RejectMalformedRequests's handlers take the raw bytes (intake_interceptors lists it after this one).
        if not inference or handler is None or handler.request_deserializer is not None:
            return handler
        metadata = handler_call_details.invocation_metadata
        serialize = handler.response_serializer
        if handler.unary_unary is not None:
            behaviour = cast(UnaryBehaviour, handler.unary_unary)

            async def unary_unary(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
                caller = self._caller(metadata, context.peer())
                if caller is None:
                    return await behaviour(raw, context)
                with self._budget.lease(caller) as lease:
                    await self._take(lease, len(raw), context)
                    return await behaviour(raw, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, response_serializer=serialize)
        if handler.stream_stream is not None:
            streaming = cast(StreamBehaviour, handler.stream_stream)

            async def stream_stream(
                raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                caller = self._caller(metadata, context.peer())
                if caller is None:
                    async for response in streaming(raw_requests, context):
                        yield response
                    return
                # One lease per message not yet answered, oldest first: each answer returns the oldest.
                held: collections.deque[contextlib.ExitStack] = collections.deque()

                async def leased() -> AsyncIterator[bytes]:
                    async for raw in raw_requests:
                        message = contextlib.ExitStack()
                        held.append(message)
                        await self._take(message.enter_context(self._budget.lease(caller)), len(raw), context)
                        yield raw

                try:
                    async for response in streaming(leased(), context):
                        if held:
                            held.popleft().close()
                        yield response
                finally:
                    while held:
                        held.popleft().close()

            return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=serialize)
        return handler

    def _caller(self, metadata: Metadata, peer: str) -> str | None:
        """Who sends the call, for its share (None on the adapter's Unix socket): its bearer token when the gateway
        checks tokens (the adapter's key: one token's HTTP bodies and gRPC messages share one share); else its
        connection's peer address, and the client address that peer names in CLIENT_ADDRESS_HEADER (Envoy writes it
        on its gRPC routes). Applications may reach this port without Envoy, so a named address counts only with
        the peer that named it: nobody takes another caller's share by naming its address."""
        if peer.startswith("unix:"):
            return None
        if self._checks_tokens:
            return f"token {bearer_token(metadata)}"
        host = peer_host(peer)
        named = next((value for key, value in metadata or () if key == CLIENT_ADDRESS_HEADER), "")
        return f"address {named} via {host}" if isinstance(named, str) and named else f"address {host}"

    async def _take(self, lease: BodyLease, size: int, context: grpc.aio.ServicerContext) -> None:
        try:
            lease.grow(size)
        except AdapterError:
            budget = self._budget
            if budget.held_by(lease.caller) + size > budget.caller_limit:
                held = (
                    f"as many bytes of this caller's requests as one caller may ({budget.caller_limit} bytes, "
                    "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES): wait for answers before sending more, or "
                    "send smaller requests"
                )
            else:
                held = f"as many request bytes as it may ({budget.limit} bytes, SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES)"
            await abort(
                context,
                ResourceExhausted(
                    f"this message of {size} bytes was not read: the gateway holds {held}; retry",
                    reason="OVERLOADED",
                    retry_after_s=RETRY_AFTER_S,
                ),
            )


def peer_host(peer: str) -> str:
    """The address of a gRPC peer ('ipv4:10.0.0.5:41234', 'ipv6:[::1]:41234') without its port."""
    address = peer.partition(":")[2]
    host = address.rpartition(":")[0] or address
    return host.removeprefix("[").removesuffix("]")
