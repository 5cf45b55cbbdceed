"""Run the gateway until SIGTERM or SIGINT: mirror etcd, serve sie.v1.Inference, drain."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.cluster.etcd import Etcd
from sie_common.runtime.grpc_server import add_health_and_reflection, set_serving
from sie_common.runtime.metrics_server import start_metrics_server
from sie_common.runtime.transport import listen_address
from sie_gateway.cluster_view import ClusterView
from sie_gateway.demand import DemandRecorder
from sie_gateway.dispatch import Dispatcher
from sie_gateway.http_adapter.server import InternalSocket, body_budget, start_http_adapter
from sie_gateway.inference_api import GatewayInference
from sie_gateway.metrics import register_gateway
from sie_gateway.pools import PoolManager
from sie_gateway.request_budget import gateway_transport, intake_interceptors
from sie_gateway.settings import GatewaySettings
from sie_gateway.worker_link import worker_connector

log = logging.getLogger(__name__)

INFERENCE_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
DRAIN_GRACE_S = 30.0


async def serve(settings: GatewaySettings) -> None:
    transport = gateway_transport(settings)
    etcd = Etcd.from_settings(settings)
    await etcd.connect()
    demand = DemandRecorder(etcd)
    dispatcher = Dispatcher(
        window=settings.worker_window,
        max_attempts=settings.max_attempts,
        connect=worker_connector(settings),
        demand=demand,
    )
    view = ClusterView(etcd, on_workers_changed=dispatcher.workers_changed)
    api = GatewayInference(settings, view, dispatcher, PoolManager(etcd, view, settings), demand)

    # The request bytes of gRPC calls and of the HTTP adapter's bodies in flight, from one budget.
    budget = body_budget(settings)
    server = grpc.aio.server(interceptors=intake_interceptors(settings, budget), options=transport.server_options())
    inference_pb2_grpc.add_InferenceServicer_to_server(api, server)
    health = await add_health_and_reflection(server, [INFERENCE_SERVICE])
    listen = listen_address(settings.host, settings.port)
    transport.listen(server, listen)
    # The HTTP adapter (docs/http.md) calls this server on a Unix socket of its own.
    internal = InternalSocket() if settings.http_port else None
    if internal is not None:
        server.add_insecure_port(internal.target)
    register_gateway(lambda: api.in_flight, demand, view, settings.configured_gpus)
    metrics = start_metrics_server(settings.host, settings.metrics_port, lambda: health.ready)
    await server.start()
    await view.start()  # readiness: SERVING only once the mirror is synced
    adapter = None
    if internal is not None:
        adapter = await start_http_adapter(settings, internal, budget)
    await set_serving(health, [INFERENCE_SERVICE], True)
    log.info(
        "sie-gateway serving sie.v1.Inference on %s (etcd %s; %d models, %d workers)",
        listen,
        ",".join(etcd.endpoints),
        len(view.models),
        len(view.workers),
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await set_serving(health, [INFERENCE_SERVICE], False)
    if adapter is not None:
        await adapter.stop()
    await server.stop(DRAIN_GRACE_S)
    if internal is not None:
        internal.remove()
    await view.stop()
    await dispatcher.close()
    await etcd.close()
    if metrics is not None:
        metrics.stop()
