"""What every wire of the adapter is (Wire) and what its handlers share (Adapter)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from sie_common.edge.auth import CLIENT_ADDRESS_HEADER, Check, authorization, bearer_token
from sie_common.edge.errors import SieError
from sie_gateway.client_address import ClientAddresses
from sie_gateway.http_adapter.bodies import (
    JSON_TYPE,
    MSGPACK_TYPE,
    BodyBudget,
    BodyLease,
    BodyLimits,
    json_body,
    msgpack_body,
    read_body,
    require_content_type,
)
from sie_gateway.http_adapter.errors import AdapterError, from_sie_error
from sie_gateway.http_adapter.gateway_calls import GatewayCalls

# Where a request keeps its lease of the body budget (server.py opens it, read_body grows it).
BODY_LEASE = web.RequestKey("body_lease", BodyLease)


class Wire(Protocol):
    """One protocol the adapter speaks."""

    def claims(self, request: web.Request) -> bool:
        """Whether this wire answers `request` (by its path, or by the reference SDK's headers)."""
        ...

    async def serve(self, request: web.Request, adapter: Adapter) -> web.StreamResponse:
        """The answer; an AdapterError for a refusal or a failure (its route's 404 / 405 included)."""
        ...

    def error_response(self, error: AdapterError) -> web.Response: ...


@dataclass
class Adapter:
    """What every handler shares: the calls into the gateway, the body limits and budget, and the gateway's own
    token check (SIE_AUTH_MODE; None without one), which every route runs before anything else."""

    calls: GatewayCalls
    limits: BodyLimits
    budget: BodyBudget
    max_items: int
    addresses: ClientAddresses
    token_check: Check | None = None

    def authorize(self, request: web.Request) -> None:
        """401 / 403 unless the request presents a token the gateway accepts: the check its gRPC interceptor runs
        (sie_common.edge.auth), here before the body is read, so a caller without a token holds nothing."""
        try:
            authorization(_authorization(request))  # two headers are refused with or without a token check
            if self.token_check is not None:
                self.token_check(_authorization(request))
        except SieError as error:
            raise from_sie_error(error) from None

    def caller(self, request: web.Request) -> str:
        """Who sends `request`, for its share of the body budget: its bearer token when the gateway checks tokens
        (authorize has accepted it); without a token check, its client's address: the one Envoy writes in
        CLIENT_ADDRESS_HEADER over whatever the client sent, from a trusted proxy (SIE_GATEWAY_TRUSTED_PROXIES), else
        the connection's own peer."""
        if self.token_check is not None:
            return f"token {bearer_token(_authorization(request))}"
        return f"address {self.addresses.client(request.remote or '', request.headers.get(CLIENT_ADDRESS_HEADER))}"

    async def json(self, request: web.Request) -> Any:
        """The JSON body (415 unless sent as application/json)."""
        require_content_type(request, JSON_TYPE)
        # Parsed on a thread: a body of 16 MiB takes tens of milliseconds the gateway's other callers need.
        return await asyncio.to_thread(json_body, await self._read(request), self.limits)

    async def msgpack(self, request: web.Request) -> dict[str, Any]:
        """The msgpack body (415 unless sent as application/msgpack)."""
        require_content_type(request, MSGPACK_TYPE)
        return await asyncio.to_thread(msgpack_body, await self._read(request), self.limits)

    async def _read(self, request: web.Request) -> bytearray:
        lease: BodyLease = request[BODY_LEASE]
        return await read_body(request, self.limits, lease)


def _authorization(request: web.Request) -> list[tuple[str, str]]:
    """The request's authorization headers, as the gRPC metadata the token check reads."""
    return [("authorization", value) for value in request.headers.getall("authorization", ())]
