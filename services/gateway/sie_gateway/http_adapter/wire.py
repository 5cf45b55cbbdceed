"""What every wire of the adapter is (Wire) and what its handlers share (Adapter)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from sie_gateway.http_adapter.bodies import (
    JSON_TYPE,
    MSGPACK_TYPE,
    BodyBudget,
    BodyLimits,
    json_body,
    msgpack_body,
    read_body,
    require_content_type,
)
from sie_gateway.http_adapter.errors import AdapterError
from sie_gateway.http_adapter.gateway_calls import GatewayCalls


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
    """What every handler shares: the calls into the gateway and the body limits."""

    calls: GatewayCalls
    limits: BodyLimits
    budget: BodyBudget
    max_items: int

    async def json(self, request: web.Request) -> Any:
        """The JSON body (415 unless sent as application/json)."""
        require_content_type(request, JSON_TYPE)
        return json_body(await read_body(request, self.limits), self.limits)

    async def msgpack(self, request: web.Request) -> dict[str, Any]:
        """The msgpack body (415 unless sent as application/msgpack)."""
        require_content_type(request, MSGPACK_TYPE)
        return msgpack_body(await read_body(request, self.limits), self.limits)
