"""Run the worker's gRPC server until SIGTERM or SIGINT, then drain.

Draining, in order: health says NOT_SERVING; in a cluster, the registration says the worker is draining (gateways
route nothing new to it and keep the Work streams that carry what it still has to answer); requests already
accepted finish and are answered (up to SIE_DRAIN_TIMEOUT_S; new ones are refused SHUTTING_DOWN, which a gateway
sends to another worker); the server stops, giving open calls STOP_GRACE_S to take their last answers; then the
registration's lease is revoked. Requests still unfinished at the drain deadline are cancelled: their streams
break, and a gateway sends them to another worker.

The signal handlers are installed before anything else: a signal during start-up (connecting to etcd, preloading,
registering) ends the start where it is (the preloads are abandoned, nothing more is registered) and the same stop
follows, exit 0. Before, one that came before the preloads had finished killed the process (SIGTERM's default). A
worker whose id another process has taken over (`Registration`'s `on_superseded`) stops the same way. One that came
while the worker's modules were imported, before these handlers (`stop_signals`), ends serve before it starts
anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc, worker_pb2, worker_pb2_grpc
from sie_common.cluster.cluster_store import WorkerRecord
from sie_common.cluster.etcd import Etcd
from sie_common.edge.auth import WORK_CALLS, Authorize, Check, inference_checks, token_check
from sie_common.edge.malformed_requests import RejectMalformedRequests
from sie_common.runtime.grpc_server import add_health_and_reflection, advertised_address, set_serving
from sie_common.runtime.metrics_server import start_metrics_server
from sie_common.runtime.stop_signals import STOP_SIGNALS, received_before_serving
from sie_common.runtime.transport import ServerTransport, listen_address
from sie_worker.api.inference import InferenceService
from sie_worker.api.work import WorkService
from sie_worker.cluster.config_sync import ConfigSync
from sie_worker.cluster.registration import Registration
from sie_worker.engine.engine import Engine
from sie_worker.metrics import register_engine
from sie_worker.models.catalog import read_catalog
from sie_worker.models.device import configure_kernels, select_device
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import check_local_cache_writable

log = logging.getLogger(__name__)

INFERENCE_SERVICE = inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name
WORKER_SERVICE = worker_pb2.DESCRIPTOR.services_by_name["Worker"].full_name
# After the drain, open calls (idle streams) get this long before they are cancelled.
STOP_GRACE_S = 1.0


async def serve(settings: WorkerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, stop.set)
    if received_before_serving():  # while the worker's modules were imported: nothing is started yet
        log.info("stopped while starting: a stop signal came before anything was started")
        return
    check_local_cache_writable(settings)
    transport = ServerTransport.of(settings)
    device = select_device(settings.device)
    configure_kernels(device)
    engine = Engine(settings, ModelRegistry(read_catalog(settings), settings, device))
    server = grpc.aio.server(
        interceptors=[Authorize(_checks(settings)), RejectMalformedRequests()], options=transport.server_options()
    )
    inference = InferenceService(engine)
    inference_pb2_grpc.add_InferenceServicer_to_server(inference, server)
    handlers: dict[str, Callable[[Any], Awaitable[Any]]] = {
        "encode": _answered_before_drain(engine, inference.run_encode),
        "score": _answered_before_drain(engine, inference.run_score),
        "extract": _answered_before_drain(engine, inference.run_extract),
    }
    worker_pb2_grpc.add_WorkerServicer_to_server(WorkService(handlers, settings.worker_id, engine.limits), server)
    services = [INFERENCE_SERVICE, WORKER_SERVICE]
    health = await add_health_and_reflection(server, services)  # NOT_SERVING until the preloads finish
    address = listen_address(settings.host, settings.port)
    transport.listen(server, address)
    register_engine(engine)
    metrics = start_metrics_server(settings.host, settings.metrics_port, lambda: health.ready)
    await server.start()
    # Connecting is bounded (each endpoint a call timeout); a signal meanwhile is seen once it is done.
    cluster = await _Cluster.follow(settings, engine) if settings.etcd_endpoints else None
    started = await _unless_stopped(engine.start(), stop)  # preloads, including models only etcd knows
    # A signal that comes while the record is being written is handled once it is written: the stop revokes it.
    if started and cluster is not None and not stop.is_set():
        await cluster.register(settings, engine, on_superseded=stop.set)
    if stop.is_set():
        log.info("stopped while starting%s", "" if started else ": the preloads are abandoned")
    else:
        await set_serving(health, services, True)
        catalog = engine.registry.catalog
        log.info(
            "sie-worker %s serving sie.v1.Inference and sie.v1.Worker on %s "
            "(device %s, bundle %s, memory limit: %s; models: %s; config problems: %d)",
            settings.worker_id,
            address,
            engine.device,
            catalog.bundle.id,
            engine.registry.pressure.describe(),
            ", ".join(engine.registry.model_ids),
            len(catalog.problems),
        )

    await stop.wait()
    log.info("stopping: draining in-flight requests (up to %.0f s)", settings.drain_timeout_s)
    await set_serving(health, services, False)
    if cluster is not None:
        await cluster.draining()  # gateways stop routing new requests here, and keep the streams of those in flight
    if await engine.drain(settings.drain_timeout_s):
        log.info("drained: no requests in flight")
    else:
        log.warning("drain deadline passed with %d requests in flight; cancelling them", engine.in_flight)
    await server.stop(STOP_GRACE_S)
    if cluster is not None:
        await cluster.deregister()
        await cluster.leave()
    await engine.stop()
    if metrics is not None:
        metrics.stop()


async def _unless_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event) -> bool:
    """Run `work` until it ends, or until `stop` is set first (then it is cancelled); whether it ended."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        task.result()  # what it raised
        return True
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return False


def _answered_before_drain(engine: Engine, handler: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    """`handler`, holding a drain until its answer is built (not only while the engine computes it)."""

    async def answer(request: Any) -> Any:
        with engine.answering():
            return await handler(request)

    return answer


def _checks(settings: WorkerSettings) -> dict[str, Check]:
    """Inference needs an inference token in static auth mode; Work streams need SIE_WORKER_TOKEN when it is set."""
    checks = inference_checks(settings.auth_mode, settings.auth_tokens)
    if settings.worker_token:
        checks[WORK_CALLS] = token_check([settings.worker_token], what="open a Work stream")
    return checks


class _Cluster:
    """A worker's membership of a cluster: the etcd connection, config sync and registration."""

    def __init__(self, etcd: Etcd, config_sync: ConfigSync) -> None:
        self.etcd = etcd
        self.config_sync = config_sync
        self.registration: Registration | None = None

    @classmethod
    async def follow(cls, settings: WorkerSettings, engine: Engine) -> _Cluster:
        """Connect and start serving the control plane's model configs for this bundle."""
        etcd = Etcd.from_settings(settings)
        await etcd.connect()
        config_sync = ConfigSync(settings, engine.registry, etcd)
        await config_sync.start()
        return cls(etcd, config_sync)

    async def register(self, settings: WorkerSettings, engine: Engine, *, on_superseded: Callable[[], None]) -> None:
        """Publish this worker under its lease, so gateways route to it; `on_superseded` once another process took
        the worker id over."""
        address = advertised_address(settings.host, settings.port, settings.advertise_address)

        def record() -> WorkerRecord:
            return WorkerRecord(
                worker_id=settings.worker_id,
                address=address,
                bundle=settings.bundle,
                machine_profile=settings.machine_profile,
                pool=settings.pool,
                gpu_count=settings.gpu_count,
                loaded_models=engine.registry.loaded_model_ids,
                queue_depth=engine.in_flight,
                free_capacity=max(0, settings.max_concurrent_requests - engine.in_flight),
                bundle_config_hash=self.config_sync.bundle_config_hash or "",
            )

        self.registration = Registration(
            self.etcd,
            settings.worker_id,
            record,
            ttl_s=settings.worker_lease_ttl_s,
            publish_interval_s=settings.health_publish_interval_ms / 1000,
            loop_stall_s=settings.worker_loop_stall_s,
            on_superseded=on_superseded,
        )
        await self.registration.start()

    async def draining(self) -> None:
        if self.registration is not None:
            await self.registration.drain()

    async def deregister(self) -> None:
        if self.registration is not None:
            await self.registration.stop()

    async def leave(self) -> None:
        await self.config_sync.stop()
        await self.etcd.close()
