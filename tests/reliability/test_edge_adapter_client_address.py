"""Envoy names each request's client address to the gateway's HTTP adapter in x-sie-client-address, the connection's
own peer over whatever the client sent (in that header or in x-forwarded-for): the adapter keys the body-budget share
of a caller without a token on it (tests/test_http_adapter_client_shares.py), so a client that could name itself
would be as many callers as it liked (issue 32, attack round 5). A real Envoy with the rendered config, in front of a
stand-in adapter that answers with the headers it got."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web
from edge_load import request, running_edge

from sie_common.edge.auth import CLIENT_ADDRESS_HEADER
from sie_stack.processes import free_port

# Starts processes (its Envoy).
pytestmark = pytest.mark.process


@contextlib.contextmanager
def echoing_adapter() -> Iterator[str]:
    """host:port of an HTTP server answering every request with the headers it got, as JSON."""

    async def echo(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({name.lower(): value for name, value in request.headers.items()})

    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(web.Application())
    runner.app.router.add_route("*", "/{path:.*}", echo)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/rerank", {}),
        ("/v1/rerank", {CLIENT_ADDRESS_HEADER: "10.1.2.3"}),
        ("/tei/m/embed", {CLIENT_ADDRESS_HEADER: "10.1.2.3", "x-forwarded-for": "10.4.5.6"}),
        ("/v1/encode/m", {"x-sie-sdk-version": "0.10.1", "x-forwarded-for": "10.4.5.6"}),
    ],
)
def test_the_adapter_gets_the_connections_own_address(tmp_path, path: str, headers: dict[str, str]) -> None:
    with echoing_adapter() as adapter, running_edge(tmp_path, adapter=adapter) as edge:  # type: ignore[arg-type]
        status, _, body = request(edge.port, "POST", path, b"{}", headers=headers, source="127.0.0.7")
    assert status == 200, body
    assert json.loads(body)[CLIENT_ADDRESS_HEADER] == "127.0.0.7"
