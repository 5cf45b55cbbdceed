"""Run the config service until SIGTERM or SIGINT; a leader resigns on the way out."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

import grpc

from sie.v1 import config_pb2, config_pb2_grpc
from sie_common.cluster.bundles import load_bundles, repository_bundles_dir
from sie_common.cluster.etcd import Etcd
from sie_common.edge.auth import Authorize
from sie_common.edge.malformed_requests import RejectMalformedRequests
from sie_common.runtime.grpc_server import add_health_and_reflection, advertised_address, set_serving
from sie_common.runtime.metrics_server import start_metrics_server
from sie_common.runtime.transport import ServerTransport, listen_address
from sie_config.api import ConfigService, admin_checks
from sie_config.leader import LeaderElection
from sie_config.metrics import register_election
from sie_config.settings import ConfigSettings
from sie_config.store import ConfigStore

log = logging.getLogger(__name__)

CONFIG_SERVICE = config_pb2.DESCRIPTOR.services_by_name["ConfigService"].full_name
DRAIN_GRACE_S = 10.0


async def serve(settings: ConfigSettings) -> None:
    transport = ServerTransport.of(settings)
    directory = Path(settings.bundles_dir) if settings.bundles_dir else repository_bundles_dir()
    if directory is None:
        raise ValueError("SIE_BUNDLES_DIR is not set, and there is no repository bundles/ beside an installed service")
    bundles = load_bundles(directory)
    if not bundles:
        raise ValueError(f"no bundle YAML files in {directory} (SIE_BUNDLES_DIR)")
    etcd = Etcd.from_settings(settings)
    await etcd.connect()
    address = advertised_address(settings.host, settings.port, settings.advertise_address)
    store: ConfigStore | None = None

    async def on_elected() -> None:
        assert store is not None
        await store.publish_bundles()

    election = LeaderElection(etcd, address, settings.leader_ttl_s, on_elected)
    store = ConfigStore(etcd, election, bundles, settings.idempotency_ttl_s, settings.max_model_config_bytes)

    authorize = Authorize(admin_checks(settings))
    server = grpc.aio.server(interceptors=[authorize, RejectMalformedRequests()], options=transport.server_options())
    config_pb2_grpc.add_ConfigServiceServicer_to_server(ConfigService(store, settings), server)
    health = await add_health_and_reflection(server, [CONFIG_SERVICE])
    listen = listen_address(settings.host, settings.port)
    transport.listen(server, listen)
    register_election(election)
    metrics = start_metrics_server(settings.host, settings.metrics_port, lambda: health.ready)
    await server.start()
    election.start()
    await set_serving(health, [CONFIG_SERVICE], True)
    log.info(
        "sie-config serving sie.v1.ConfigService on %s (etcd %s, prefix %s; admin writes: %s)",
        listen,
        ",".join(etcd.endpoints),
        etcd.prefix,
        _admin_stance(settings),
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await set_serving(health, [CONFIG_SERVICE], False)
    await server.stop(DRAIN_GRACE_S)
    await election.stop()
    await etcd.close()
    if metrics is not None:
        metrics.stop()


def _admin_stance(settings: ConfigSettings) -> str:
    if settings.admin_token:
        return "need SIE_ADMIN_TOKEN"
    if settings.allow_unauthenticated_admin:
        return "open to anyone on loopback (SIE_ALLOW_UNAUTHENTICATED_ADMIN)"
    return "disabled (no SIE_ADMIN_TOKEN)"
