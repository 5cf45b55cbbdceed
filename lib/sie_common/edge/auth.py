"""Bearer-token checks on gRPC metadata (`authorization: Bearer <token>`), in constant time.

Servers check tokens in one interceptor (`Authorize`), before the request is
decoded or validated, so a caller without a token learns nothing about what
the method would have made of its request. Tokens never appear in errors or logs.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc

from sie_common.edge.errors import PermissionDenied, SieError, Unauthenticated, abort
from sie_common.runtime.settings import SettingsError

_SCHEME = "bearer "
AUTH_MODES = ("none", "static")
INFERENCE_CALLS = "/sie.v1.Inference/"
WORK_CALLS = "/sie.v1.Worker/"

# The header in which Envoy names a request's client address on its routes to the gateway's HTTP adapter, replacing
# any the client sent: who a caller without a token is, for its share of the adapter's body budget.
CLIENT_ADDRESS_HEADER = "x-sie-client-address"

Metadata = Iterable[tuple[str, str | bytes]] | None
# Raises a SieError when the call may not go ahead.
Check = Callable[[Metadata], None]


def authorization(metadata: Metadata) -> str | bytes | None:
    """The request's one `authorization` header, if it has one; UNAUTHENTICATED for more than one (which would a
    check read, which a pool's owner, which an intermediary? None: the request is refused). A value with a comma is
    more than one too: proxies join repeated headers with commas (Envoy does for `authorization`), and no bearer
    token has one."""
    values = [value for key, value in metadata or () if key.lower() == "authorization"]
    if len(values) > 1 or (values and isinstance(values[0], str) and "," in values[0]):
        raise Unauthenticated(
            "the request has more than one 'authorization' header (or one with values joined by ','): send exactly "
            "one, 'authorization: Bearer <token>'",
            reason="DUPLICATE_AUTHORIZATION",
        )
    return values[0] if values else None


def bearer_token(metadata: Metadata) -> str | None:
    """The token of the request's `authorization: Bearer ...` header, if there is one (UNAUTHENTICATED for two)."""
    value = authorization(metadata)
    if isinstance(value, str) and value[: len(_SCHEME)].lower() == _SCHEME:
        return value[len(_SCHEME) :].strip()
    return None


def bearer_metadata(token: str) -> tuple[tuple[str, str]]:
    """The metadata that presents `token`."""
    return (("authorization", f"Bearer {token}"),)


def require_token(metadata: Metadata, accepted: Iterable[str], *, what: str) -> None:
    """Raise UNAUTHENTICATED without a bearer token and PERMISSION_DENIED when it matches none of `accepted`."""
    token = bearer_token(metadata)
    if token is None:
        raise Unauthenticated(
            f"{what} needs an 'authorization: Bearer <token>' header",
            reason="MISSING_TOKEN",
        )
    presented = token.encode()
    # Compare against every accepted token so the time taken does not say which one was close.
    matches = [hmac.compare_digest(presented, candidate.encode()) for candidate in accepted]
    if not any(matches):
        raise PermissionDenied(f"the bearer token is not allowed to {what}", reason="INVALID_TOKEN")


def token_check(accepted: Sequence[str], *, what: str) -> Check:
    """A check that lets through calls presenting one of `accepted`."""
    return lambda metadata: require_token(metadata, accepted, what=what)


def check_auth_mode(auth_mode: str, auth_tokens: Sequence[str]) -> None:
    """Refuse an unknown SIE_AUTH_MODE, and static mode without tokens."""
    if auth_mode not in AUTH_MODES:
        raise SettingsError(f"SIE_AUTH_MODE={auth_mode!r}: expected one of {', '.join(AUTH_MODES)}")
    if auth_mode == "static" and not auth_tokens:
        raise SettingsError("SIE_AUTH_MODE=static needs at least one token in SIE_AUTH_TOKENS")


def inference_checks(auth_mode: str, auth_tokens: Sequence[str]) -> dict[str, Check]:
    """With SIE_AUTH_MODE=static, every sie.v1.Inference call needs one of SIE_AUTH_TOKENS."""
    if auth_mode != "static":
        return {}
    return {INFERENCE_CALLS: token_check(auth_tokens, what="call the inference API")}


class Authorize(grpc.aio.ServerInterceptor):
    """Run a method's check on the call's metadata before anything else: decoding, validation, the handler.
    A call with more than one `authorization` header is refused UNAUTHENTICATED, whatever its method.

    `checks` maps a method (`/sie.v1.ConfigService/AddModel`) or a whole service
    (`/sie.v1.Inference/`) to its check; a method's own check wins. Calls with
    no check (health, reflection) go through. Put it first among the interceptors.
    """

    def __init__(self, checks: Mapping[str, Check]) -> None:
        self._checks = dict(checks)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        check = self._checks.get(method) or self._checks.get(method[: method.rfind("/") + 1])
        if handler is None:
            return handler
        metadata = handler_call_details.invocation_metadata
        try:
            authorization(metadata)  # two headers are refused on every call, checked or not
            if check is not None:
                check(metadata)
        except SieError as error:
            return _refusal(handler, error)
        return handler


def _refusal(handler: grpc.RpcMethodHandler, error: SieError) -> grpc.RpcMethodHandler:
    """A handler of `handler`'s shape that answers `error` without reading the request."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await abort(context, error)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await abort(context, error)
        yield  # never reached; makes this an async generator, as streaming handlers are

    serialize = handler.response_serializer
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serialize)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, response_serializer=serialize)
    return grpc.stream_stream_rpc_method_handler(streaming, response_serializer=serialize)


class PresentToken(grpc.aio.StreamStreamClientInterceptor):
    """Send `authorization: Bearer <token>` on every stream a channel opens (the gateway's Work streams)."""

    def __init__(self, token: str) -> None:
        self._metadata = bearer_metadata(token)

    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any
    ) -> Any:
        metadata = grpc.aio.Metadata(*(client_call_details.metadata or ()), *self._metadata)
        details = client_call_details
        with_token = grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )
        return await continuation(with_token, request_iterator)
