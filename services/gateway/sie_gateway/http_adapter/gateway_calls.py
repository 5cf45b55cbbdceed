"""The adapter's calls into the gateway: the contract's RPCs over one grpc.aio channel on a Unix socket only this
process's user may open, carrying the caller's credentials, routing headers and trace context as gRPC metadata, so
the gateway's authentication, bounds, routing, metrics and tracing are the ones every other path has."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf.message import Message

from sie.v1 import inference_pb2_grpc
from sie_gateway.http_adapter.errors import from_rpc_error, invalid

# Request headers passed on as gRPC metadata (lower case): credentials, the gateway's routing headers, trace context.
FORWARDED_HEADERS = (
    "authorization",
    "x-sie-machine-profile",
    "x-sie-pool",
    "idempotency-key",
    "traceparent",
    "tracestate",
)


class GatewayCalls:
    """The contract's Inference RPCs, called on the gateway at `target` (a `unix:` address)."""

    def __init__(self, target: str, options: list[tuple[str, int]]) -> None:
        self._channel = grpc.aio.insecure_channel(target, options=options)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def call(self, method: str, request: Message, headers: Mapping[str, str]) -> Any:
        """`method` (an Inference RPC's name) with `request`; an AdapterError from the gateway's status."""
        metadata = []
        for name in FORWARDED_HEADERS:
            value = headers.get(name)
            if value is None:
                continue
            if not (value.isascii() and value.isprintable()):
                raise invalid(f"header {name!r} must be printable ASCII", reason="INVALID_HEADER", field=name)
            metadata.append((name, value))
        try:
            return await getattr(self._stub, method)(request, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
