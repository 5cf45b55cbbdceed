"""Run the worker's gRPC server until SIGTERM or SIGINT, then drain."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc
from sie_common.grpc_server import add_health_and_reflection, set_serving
from sie_worker.config_sync import ConfigSync
from sie_worker.engine import Engine
from sie_worker.inference_api import InferenceService
from sie_worker.settings import WorkerSettings
from sie_worker.work_api import WorkService

log = logging.getLogger(__name__)

INFERENCE_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
# In-flight calls get this long to finish after a stop signal.
DRAIN_GRACE_S = 30.0


async def serve(settings: WorkerSettings) -> None:
    engine = Engine(settings)
    server = grpc.aio.server()
    inference = InferenceService(engine)
    inference_pb2_grpc.add_InferenceServicer_to_server(inference, server)
    handlers = {"encode": inference.run_encode, "score": inference.run_score, "extract": inference.run_extract}
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkService(handlers, settings.worker_id), server)
    services = [INFERENCE_SERVICE, WORKER_SERVICE]
    health = add_health_and_reflection(server, services)
    # grpc's HealthServicer starts "" as SERVING; nothing is served before the preloads finish.
    await set_serving(health, services, False)
    address = f"{settings.host}:{settings.port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    await engine.start()
    config_sync = ConfigSync(settings, engine.registry) if settings.etcd_endpoints else None
    if config_sync is not None:
        await config_sync.start()
    await set_serving(health, services, True)
    log.info(
        "sie-worker %s serving sie.v1.Inference and sie.v1.Worker on %s (device %s; models: %s)",
        settings.worker_id, address, engine.device, ", ".join(engine.registry.model_ids),
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    log.info("stopping: draining in-flight requests (up to %.0f s)", DRAIN_GRACE_S)
    await set_serving(health, services, False)
    await server.stop(DRAIN_GRACE_S)
    if config_sync is not None:
        await config_sync.stop()
    await engine.stop()
