"""Resource pools: workers reserved for one tenant, held by an etcd lease.

`pools/<name>` lists the assigned workers and is bound to the pool's own
lease, so a pool that is not renewed within its TTL expires by itself and its
workers go back to shared use. Workers are assigned from shared, ready
workers of each requested machine profile at creation and topped up on every
renewal (a pool created before its workers exist fills up as they register).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from google.protobuf import timestamp_pb2

from sie.v1 import inference_pb2
from sie_common.cluster_store import POOLS, PoolRecord, decode_pool, encode_pool
from sie_common.errors import AlreadyExists, InvalidArgument, NotFound
from sie_common.etcd import Etcd
from sie_gateway.cluster_view import ClusterView

_POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


class PoolManager:
    def __init__(self, etcd: Etcd, view: ClusterView, default_ttl_s: int) -> None:
        self._etcd = etcd
        self._view = view
        self._default_ttl_s = default_ttl_s

    async def create(self, name: str, gpus: Mapping[str, int], ttl_s: int) -> inference_pb2.Pool:
        if not _POOL_NAME.match(name):
            raise InvalidArgument(
                f"pool name {name!r} must be 1-63 lowercase letters, digits, '.', '_' or '-'", reason="INVALID_POOL_NAME"
            )
        if not gpus or any(count <= 0 for count in gpus.values()):
            raise InvalidArgument("gpus: give at least one machine profile with a positive worker count", reason="INVALID_POOL_GPUS")
        ttl_s = ttl_s or self._default_ttl_s
        lease = await self._etcd.grant_lease(ttl_s)
        record = PoolRecord(name, dict(gpus), ttl_s, lease, self._assign(name, gpus, ()), time.time() + ttl_s)
        key = self._etcd.key(POOLS + name)
        created, _ = await self._etcd.txn(
            [self._etcd.ops.version(key) == 0], [self._etcd.ops.put(key, encode_pool(record), lease=lease)]
        )
        if not created:
            await self._etcd.revoke_lease(lease)
            raise AlreadyExists(f"pool {name!r} already exists", reason="POOL_EXISTS", metadata={"pool": name})
        return self.message(record)

    async def renew(self, name: str) -> inference_pb2.Pool:
        """Refresh the lease and top up missing workers."""
        entry = await self._etcd.get(POOLS + name)
        if entry is None or await self._etcd.keep_alive(decode_pool(entry.value).lease) <= 0:
            raise NotFound(f"pool {name!r} does not exist (or expired)", reason="POOL_NOT_FOUND", metadata={"pool": name})
        record = decode_pool(entry.value)
        renewed = PoolRecord(
            record.name, record.gpus, record.ttl_s, record.lease,
            self._assign(name, record.gpus, record.workers), time.time() + record.ttl_s,
        )
        key = self._etcd.key(POOLS + name)
        await self._etcd.txn(
            [self._etcd.ops.mod_revision(key) == entry.mod_revision],
            [self._etcd.ops.put(key, encode_pool(renewed), lease=record.lease)],
        )
        return self.message(renewed)

    async def delete(self, name: str) -> None:
        entry = await self._etcd.get(POOLS + name)
        if entry is None:
            raise NotFound(f"pool {name!r} does not exist", reason="POOL_NOT_FOUND", metadata={"pool": name})
        await self._etcd.revoke_lease(decode_pool(entry.value).lease)

    def get(self, name: str) -> inference_pb2.Pool:
        record = self._view.pools.get(name)
        if record is None:
            raise NotFound(f"pool {name!r} does not exist", reason="POOL_NOT_FOUND", metadata={"pool": name})
        return self.message(record)

    def message(self, record: PoolRecord) -> inference_pb2.Pool:
        profile_of = {worker.worker_id: worker.machine_profile for worker in self._view.workers.values()}
        return inference_pb2.Pool(
            name=record.name,
            gpus=dict(record.gpus),
            ttl_s=record.ttl_s,
            expires_at=timestamp_pb2.Timestamp(seconds=int(record.expires_at)),
            workers=list(record.workers),
            ready=record.ready(profile_of),
        )

    def _assign(self, name: str, gpus: Mapping[str, int], current: tuple[str, ...]) -> tuple[str, ...]:
        """Keep the live workers already assigned, and add free shared ones up to each profile's count."""
        workers = self._view.workers
        taken = {worker for pool in self._view.pools.values() if pool.name != name for worker in pool.workers}
        kept = [worker_id for worker_id in current if worker_id in workers]
        for profile, count in gpus.items():
            have = sum(1 for worker_id in kept if workers[worker_id].machine_profile == profile)
            free = sorted(
                worker.worker_id
                for worker in workers.values()
                if worker.machine_profile == profile
                and worker.ready
                and worker.pool in ("", name)
                and worker.worker_id not in taken
                and worker.worker_id not in kept
            )
            kept += free[: max(0, count - have)]
        return tuple(kept)
