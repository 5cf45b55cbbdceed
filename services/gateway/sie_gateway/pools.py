"""Resource pools: workers reserved for one tenant, held by an etcd lease.

`pools/<name>` lists the assigned workers and is bound to the pool's own
lease, so a pool that is not renewed within its TTL expires by itself and its
workers go back to shared use. Workers are assigned from shared, ready
workers of each requested machine profile at creation and topped up on every
renewal (a pool created before its workers exist fills up as they register).

Pools reserve capacity, so creating one through the API is refused unless the
operator turned it on (SIE_POOLS_ENABLED), and is bounded: workers per pool,
lease length, and the workers all pools of one caller (bearer token) hold.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Mapping

from google.protobuf import timestamp_pb2

from sie.v1 import inference_pb2
from sie_common.cluster.cluster_store import POOLS, PoolRecord, decode_all, decode_pool, encode_pool
from sie_common.cluster.etcd import Etcd
from sie_common.edge.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
)
from sie_common.edge.request_bounds import RequestBounds, check_name
from sie_gateway.cluster_view import ClusterView
from sie_gateway.settings import GatewaySettings

_POOL_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
# A creation or renewal that lost a race with another write to the pools reads them again, this many times.
_WRITE_ATTEMPTS = 3


def pool_owner(token: str | None) -> str:
    """Who a pool counts against: a digest of the caller's bearer token ("" without one), never the token."""
    return hashlib.sha256(token.encode()).hexdigest()[:16] if token else ""


def _check_owner(record: PoolRecord, token: str | None, action: str) -> None:
    """PERMISSION_DENIED unless `token` is the one that created the pool (without tokens, everyone is the same
    caller)."""
    if pool_owner(token) != record.owner:
        raise PermissionDenied(
            f"pool {record.name!r} was created with another token; only that token may {action} it",
            reason="POOL_NOT_OWNED",
            metadata={"pool": record.name},
        )


def check_pool_name(name: str, bounds: RequestBounds, field: str = "name") -> None:
    """NAME_TOO_LONG over SIE_MAX_NAME_BYTES, else INVALID_POOL_NAME unless `name` is 1-63 of [a-z0-9._-]: before
    etcd is asked, and quoting at most 80 characters of it (an error quoting a whole 50 kB name is trailers no
    client reads)."""
    check_name(field, name, bounds)
    if not _POOL_NAME.fullmatch(name):
        shown = name if len(name) <= 80 else name[:80] + "..."
        raise InvalidArgument(
            f"pool name {shown!r} must be 1-63 lowercase letters, digits, '.', '_' or '-'", reason="INVALID_POOL_NAME"
        )


class PoolManager:
    def __init__(self, etcd: Etcd, view: ClusterView, settings: GatewaySettings) -> None:
        self._etcd = etcd
        self._view = view
        self._settings = settings
        self._quotas = {pool_owner(token): workers for token, workers in settings.token_pool_quotas().items()}
        self._bounds = RequestBounds(**RequestBounds.fields_from(settings))

    async def create(
        self, name: str, gpus: Mapping[str, int], ttl_s: int, token: str | None = None, bundle: str = ""
    ) -> inference_pb2.Pool:
        """Reserve workers for a new pool (only of `bundle` when given), within the operator's bounds; `token` is the
        caller's bearer token."""
        settings = self._settings
        if not settings.pools_enabled:
            raise FailedPrecondition(
                "creating resource pools is turned off on this gateway (the operator sets SIE_POOLS_ENABLED=true)",
                reason="POOLS_DISABLED",
            )
        # Before anything echoes them: a name too long for an error's trailers would lose the error.
        check_pool_name(name, self._bounds)
        check_name("bundle", bundle, self._bounds)
        for profile in gpus:
            check_name("gpus", profile, self._bounds)
        if not gpus or any(count <= 0 for count in gpus.values()):
            raise InvalidArgument(
                "gpus: give at least one machine profile with a positive worker count", reason="INVALID_POOL_GPUS"
            )
        if bundle and bundle not in self._view.bundles:
            raise NotFound(
                f"bundle {bundle!r} does not exist; bundles: {', '.join(sorted(self._view.bundles)) or 'none'}",
                reason="BUNDLE_NOT_FOUND",
                metadata={"bundle": bundle},
            )
        requested = sum(gpus.values())
        if requested > settings.pool_max_workers:
            raise InvalidArgument(
                f"gpus: {requested} workers requested; a pool holds at most {settings.pool_max_workers} "
                f"(SIE_POOL_MAX_WORKERS)",
                reason="POOL_TOO_LARGE",
                metadata={"limit": str(settings.pool_max_workers), "requested": str(requested)},
            )
        ttl_s = ttl_s or settings.pool_default_ttl_s
        if ttl_s > settings.pool_max_ttl_s:
            raise InvalidArgument(
                f"ttl_s: {ttl_s} s is longer than the {settings.pool_max_ttl_s} s a pool lease may last "
                f"(SIE_POOL_MAX_TTL_S)",
                reason="POOL_TTL_TOO_LONG",
                metadata={"limit": str(settings.pool_max_ttl_s), "requested": str(ttl_s)},
            )
        owner = pool_owner(token)
        key = self._etcd.key(POOLS + name)
        for _ in range(_WRITE_ATTEMPTS):
            read_at = await self._check_quota(owner, requested)
            lease = await self._etcd.grant_lease(ttl_s)
            workers = self._assign(name, gpus, (), bundle)
            record = PoolRecord(name, dict(gpus), ttl_s, lease, workers, time.time() + ttl_s, owner, bundle)
            # Written only if no pool changed since the quota was counted: concurrent creations cannot overshoot it.
            created, _ = await self._etcd.txn(
                [self._etcd.ops.version(key) == 0, self._etcd.unchanged_since(POOLS, read_at)],
                [self._etcd.ops.put(key, encode_pool(record), lease=lease)],
            )
            if created:
                return self.message(record)
            await self._etcd.revoke_lease(lease)
            if await self._etcd.get(POOLS + name) is not None:
                raise AlreadyExists(f"pool {name!r} already exists", reason="POOL_EXISTS", metadata={"pool": name})
        raise Aborted(
            f"pools changed under {_WRITE_ATTEMPTS} attempts to create {name!r} in a row; retry",
            reason="POOL_CONTENDED",
        )

    async def _check_quota(self, owner: str, requested: int) -> int:
        """RESOURCE_EXHAUSTED when the caller's pools would hold more workers than its quota; else the revision counted
        at."""
        quota = self._quotas.get(owner, self._settings.pool_quota_workers)
        entries, read_at = await self._etcd.read_prefix(POOLS)
        pools = decode_all({entry.name: entry.value for entry in entries}, decode_pool).values()
        held = sum(sum(pool.gpus.values()) for pool in pools if pool.owner == owner)
        if held + requested > quota:
            raise ResourceExhausted(
                f"pool quota: this caller's pools hold {held} workers and may hold {quota} in all "
                f"(SIE_POOL_QUOTA_WORKERS, SIE_POOL_TOKEN_QUOTAS); delete a pool or ask for fewer",
                reason="POOL_QUOTA_EXCEEDED",
                metadata={"limit": str(quota), "held": str(held), "requested": str(requested)},
            )
        return read_at

    async def renew(self, name: str, token: str | None = None) -> inference_pb2.Pool:
        """Refresh the lease and top up missing workers (saved in etcd); only the pool's owner may."""
        check_pool_name(name, self._bounds)
        key = self._etcd.key(POOLS + name)
        for _ in range(_WRITE_ATTEMPTS):
            entry = await self._etcd.get(POOLS + name)
            if entry is None:
                raise NotFound(
                    f"pool {name!r} does not exist (or expired)", reason="POOL_NOT_FOUND", metadata={"pool": name}
                )
            record = decode_pool(entry.value)
            _check_owner(record, token, "renew")
            if await self._etcd.keep_alive(record.lease) <= 0:
                raise NotFound(
                    f"pool {name!r} does not exist (or expired)", reason="POOL_NOT_FOUND", metadata={"pool": name}
                )
            renewed = dataclasses.replace(
                record,
                workers=self._assign(name, record.gpus, record.workers, record.bundle),
                expires_at=time.time() + record.ttl_s,
            )
            saved, _ = await self._etcd.txn(
                [self._etcd.ops.mod(key) == entry.mod_revision],
                [self._etcd.ops.put(key, encode_pool(renewed), lease=record.lease)],
            )
            if saved:
                return self.message(renewed)
        raise Aborted(
            f"pool {name!r} changed under {_WRITE_ATTEMPTS} renewals in a row; retry", reason="POOL_CONTENDED"
        )

    async def delete(self, name: str, token: str | None = None) -> None:
        """Release the pool's workers; only its owner may."""
        check_pool_name(name, self._bounds)
        entry = await self._etcd.get(POOLS + name)
        if entry is None:
            raise NotFound(f"pool {name!r} does not exist", reason="POOL_NOT_FOUND", metadata={"pool": name})
        record = decode_pool(entry.value)
        _check_owner(record, token, "delete")
        await self._etcd.revoke_lease(record.lease)

    def check_use(self, name: str, token: str | None) -> None:
        """PERMISSION_DENIED when requests name a pool created through the API with another token (a pool isolates
        its creator's capacity); an operator's pool (set on its workers) has no record here and serves anyone."""
        record = self._view.pools.get(name)
        if record is not None:
            _check_owner(record, token, "send requests to")

    def get(self, name: str) -> inference_pb2.Pool:
        check_pool_name(name, self._bounds)
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
            bundle=record.bundle,
        )

    def _assign(self, name: str, gpus: Mapping[str, int], current: tuple[str, ...], bundle: str) -> tuple[str, ...]:
        """Keep the live workers already assigned, and add free shared ones (of `bundle`, when set) up to each
        profile's count."""
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
                and (not bundle or worker.bundle == bundle)
                and worker.pool in ("", name)
                and worker.worker_id not in taken
                and worker.worker_id not in kept
            )
            kept += free[: max(0, count - have)]
        return tuple(kept)
