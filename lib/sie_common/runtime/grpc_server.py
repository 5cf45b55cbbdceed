"""What every gRPC server of the engine serves beside its own API: health and reflection."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from sie_common.edge.errors import InvalidArgument, ResourceExhausted, abort

# grpc.health.v1 answers anyone (load balancers, the kubelet's probes), with or without tokens, so what a call may
# hold is bounded: a Watch keeps its request for as long as the caller stays, and 60 Watches naming a 4 MB service
# grew a gateway by 935 MB. Service names are short ("sie.v1.Inference").
MAX_HEALTH_SERVICE_CHARS = 256
MAX_HEALTH_WATCHES = 100


class ServiceHealth(health.aio.HealthServicer):
    """grpc.health.v1, also telling the metrics port's /readyz whether the server ("") is SERVING. A service name
    over MAX_HEALTH_SERVICE_CHARS is INVALID_ARGUMENT NAME_TOO_LONG; a Watch past MAX_HEALTH_WATCHES at once is
    RESOURCE_EXHAUSTED TOO_MANY_STREAMS."""

    ready = False

    def __init__(self) -> None:
        super().__init__()
        self.watches = 0

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        await _check_service_name(request, context)
        return await super().Check(request, context)

    async def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
        await _check_service_name(request, context)
        if self.watches >= MAX_HEALTH_WATCHES:
            await abort(
                context,
                ResourceExhausted(
                    f"{MAX_HEALTH_WATCHES} health Watch streams are open already; use Check, or retry",
                    reason="TOO_MANY_STREAMS",
                    metadata={"limit": str(MAX_HEALTH_WATCHES)},
                    retry_after_s=1.0,
                ),
            )
        self.watches += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watches -= 1

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        await super().set(service, status)
        if service == "":
            self.ready = status == health_pb2.HealthCheckResponse.SERVING


async def _check_service_name(request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> None:
    if len(request.service) > MAX_HEALTH_SERVICE_CHARS:
        await abort(
            context,
            InvalidArgument(
                f"the health service name has {len(request.service)} characters; the limit is "
                f'{MAX_HEALTH_SERVICE_CHARS} (name a service, e.g. sie.v1.Inference, or "" for the server)',
                reason="NAME_TOO_LONG",
                metadata={"limit": str(MAX_HEALTH_SERVICE_CHARS)},
            ),
        )


async def add_health_and_reflection(server: grpc.aio.Server, service_names: Sequence[str]) -> ServiceHealth:
    """Register grpc.health.v1 and reflection. Health starts NOT_SERVING for the server ("") and each
    named service (grpc's servicer would say SERVING for ""), so readiness waits for `set_serving`."""
    health_servicer = ServiceHealth()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    await set_serving(health_servicer, service_names, False)
    return health_servicer


async def set_serving(health_servicer: health.aio.HealthServicer, service_names: Sequence[str], serving: bool) -> None:
    """Mark the server ("") and each named service SERVING or NOT_SERVING."""
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ("", *service_names):
        await health_servicer.set(name, status)


def advertised_address(host: str, port: int, override: str | None = None) -> str:
    """host:port other processes use to reach this server: `override`, else the listen
    address, else (listening on every address) this machine's name."""
    if override:
        return override
    reachable = socket.gethostname() if host in ("0.0.0.0", "::", "[::]", "") else host
    return f"{reachable}:{port}"
