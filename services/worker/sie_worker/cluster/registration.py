"""This worker's registration in etcd (cluster mode): `workers/<worker id>` under a lease.

The lease is kept alive every third of its TTL and the record refreshed every
SIE_HEALTH_PUBLISH_INTERVAL_MS with what gateways route on: loaded models,
queue depth, free capacity, bundle config hash, readiness. If the worker dies
its lease runs out and the key disappears; on a clean stop it is revoked at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, encode_worker
from sie_common.cluster.etcd import Etcd, EtcdUnavailable

log = logging.getLogger(__name__)


class Registration:
    def __init__(
        self, etcd: Etcd, worker_id: str, record: Callable[[], WorkerRecord], *, ttl_s: int, publish_interval_s: float
    ) -> None:
        self._etcd = etcd
        self._name = WORKERS + worker_id
        self._record = record
        self._ttl_s = ttl_s
        self._publish_interval_s = publish_interval_s
        self._lease = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register now (so a gateway can route at once), then keep the registration alive."""
        await self._register()
        self._task = asyncio.create_task(self._keep_alive(), name="worker-registration")

    async def publish(self) -> None:
        """Write the current record now (e.g. right after a model loads or before draining)."""
        await self._etcd.put(self._name, encode_worker(self._record()), lease=self._lease)

    async def stop(self) -> None:
        """Deregister: revoke the lease, which deletes the key."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._lease:
            with contextlib.suppress(EtcdUnavailable):
                await self._etcd.revoke_lease(self._lease)

    async def _register(self) -> None:
        self._lease = await self._etcd.grant_lease(self._ttl_s)
        await self.publish()
        log.info("registered %s in etcd (lease TTL %d s)", self._name, self._ttl_s)

    async def _keep_alive(self) -> None:
        step = min(self._ttl_s / 3, self._publish_interval_s)
        last_publish = time.monotonic()
        while True:
            await asyncio.sleep(step)
            try:
                if await self._etcd.keep_alive(self._lease) <= 0:
                    log.warning("worker lease expired (etcd unreachable too long?); registering again")
                    await self._register()
                    last_publish = time.monotonic()
                elif time.monotonic() - last_publish >= self._publish_interval_s:
                    await self.publish()
                    last_publish = time.monotonic()
            except EtcdUnavailable as error:
                log.warning("worker registration: %s; retrying", error)
