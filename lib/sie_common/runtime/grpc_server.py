"""What every gRPC server of the engine serves beside its own API: health and reflection."""

from __future__ import annotations

import socket
from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection


class ServiceHealth(health.aio.HealthServicer):
    """grpc.health.v1, also telling the metrics port's /readyz whether the server ("") is SERVING."""

    ready = False

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        await super().set(service, status)
        if service == "":
            self.ready = status == health_pb2.HealthCheckResponse.SERVING


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
