"""The HTTP adapter's server: aiohttp (a maintained HTTP/1.1 server; no HTTP parsing of our own) in the gateway's
event loop, on its own port, serving each wire's routes; and the Unix socket its gRPC calls reach the gateway by.

Every handler turns what went wrong into its wire's error shape (Wire.error_response); an unexpected exception is
logged and answered 500 in that shape, never a bare traceback."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Awaitable, Callable

from aiohttp import web

from sie_common.edge.auth import INFERENCE_CALLS, inference_checks
from sie_gateway.client_address import ClientAddresses
from sie_gateway.http_adapter.bodies import BodyBudget, BodyLimits, refuse_content_encoding
from sie_gateway.http_adapter.errors import AdapterError
from sie_gateway.http_adapter.gateway_calls import GatewayCalls
from sie_gateway.http_adapter.openai_models import OpenAIModels
from sie_gateway.http_adapter.reference_wire import ReferenceWire
from sie_gateway.http_adapter.rerank import Rerank
from sie_gateway.http_adapter.tei import Tei
from sie_gateway.http_adapter.wire import BODY_LEASE, Adapter, Wire
from sie_gateway.settings import GatewaySettings

log = logging.getLogger(__name__)
# A refused query parameter is named in the answer cut to this many characters (as Envoy's request check does).
MAX_PARAMETER_CHARS = 200


class InternalSocket:
    """A Unix socket in a directory of its own that only this process's user may enter: the gateway listens on it
    (plaintext gRPC, whatever its TCP port's TLS), the adapter calls it."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="sie-gateway-")  # mode 0700
        self.target = f"unix:{os.path.join(self.directory, 'grpc.sock')}"

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class HttpAdapter:
    """The running adapter: `await stop()` closes its port (after in-flight requests answer) and its channel."""

    def __init__(self, runner: web.AppRunner, adapter: Adapter) -> None:
        self._runner = runner
        self._adapter = adapter

    async def stop(self) -> None:
        await self._runner.cleanup()
        await self._adapter.calls.close()


def body_budget(settings: GatewaySettings) -> BodyBudget:
    """The gateway's budget of request bytes in flight (SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_*): the adapter's bodies and
    the gRPC calls' messages (sie_gateway.request_budget) share it."""
    return BodyBudget(
        settings.http_max_body_budget_bytes,
        settings.http_max_body_budget_per_caller_bytes,
        settings.http_body_evict_after_s,
    )


async def start_http_adapter(
    settings: GatewaySettings, socket: InternalSocket, budget: BodyBudget | None = None
) -> HttpAdapter:
    """Serve every wire on settings.http_host:settings.http_port, calling the gateway on `socket`; its bodies leased
    from `budget` (the gateway's, shared with its gRPC calls; a budget of its own when None)."""
    # The channel takes what the gateway may send and sends what it may receive.
    channel_options = [
        ("grpc.max_receive_message_length", settings.max_send_message_bytes),
        ("grpc.max_send_message_length", settings.max_receive_message_bytes),
    ]
    limits = BodyLimits(
        max_bytes=settings.http_max_body_bytes,
        max_depth=settings.http_max_depth,
        max_container_len=settings.http_max_container_len,
        max_values=settings.http_max_values,
        read_timeout_s=settings.http_body_timeout_s,
    )
    adapter = Adapter(
        GatewayCalls(socket.target, channel_options),
        limits,
        budget or body_budget(settings),
        settings.max_items_per_request,
        ClientAddresses(settings.trusted_proxies),
        inference_checks(settings.auth_mode, settings.auth_tokens).get(INFERENCE_CALLS),
    )
    app = web.Application(client_max_size=limits.max_bytes)
    app.router.add_route("*", "/{path:.*}", _dispatch([Rerank(), Tei(), ReferenceWire(), OpenAIModels()], adapter))
    # A caller gone (Envoy resets its connection here) cancels its handler, and so its call into the gateway and its
    # lease of the body budget, rather than leaving them to run to the gateway's deadline.
    # auto_decompress=False: a body is read as it was sent, never inflated (compressed bodies are refused, 415).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True, auto_decompress=False)
    await runner.setup()
    await web.TCPSite(runner, settings.http_host, settings.http_port, reuse_port=False).start()
    log.info("HTTP adapter serving on %s:%d", settings.http_host, settings.http_port)
    return HttpAdapter(runner, adapter)


def _dispatch(wires: list[Wire], adapter: Adapter) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of every request: the first wire that claims it serves it, and answers what goes wrong in its own
    error shape."""

    async def serve(request: web.Request) -> web.StreamResponse:
        wire = next((wire for wire in wires if wire.claims(request)), None)
        if wire is None:
            return _not_found(request)
        try:
            # The token first, as the gateway's interceptor checks it: a caller without one reads nothing, holds
            # nothing and learns nothing about its request.
            adapter.authorize(request)
            if request.query_string:
                parameter = next(iter(request.query), "")[:MAX_PARAMETER_CHARS]
                raise AdapterError(
                    400,
                    "QUERY_NOT_ALLOWED",
                    f"query parameter {parameter!r}: no route here takes a query string; fields travel in the path "
                    "or the body (docs/http.md)",
                    metadata={"parameter": parameter},
                )
            refuse_content_encoding(request)
            with adapter.budget.lease(adapter.caller(request)) as lease:
                request[BODY_LEASE] = lease
                return await wire.serve(request, adapter)
        except AdapterError as error:
            return wire.error_response(error)
        except Exception:
            log.exception("HTTP adapter: %s %s failed", request.method, request.path[:200])
            return wire.error_response(
                AdapterError(500, "INTERNAL", "the adapter failed to serve this request (the gateway's log says why)")
            )

    return serve


def _not_found(request: web.Request) -> web.Response:
    """A path no wire takes: the JSON error body of Envoy's own 404 (docs/http.md)."""
    return web.json_response(
        {
            "code": 5,
            "message": "no HTTP route here: the paths are in docs/http.md",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "ROUTE_NOT_FOUND",
                    "domain": "sie",
                    "metadata": {},
                }
            ],
        },
        status=404,
    )
