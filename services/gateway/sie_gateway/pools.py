"""Resource pools: workers reserved for one tenant, held by an etcd lease.

`pools/<name>` lists the assigned workers and is bound to the pool's own
lease, so a pool that is not renewed within its TTL expires by itself and its
workers go back to shared use. Workers are assigned from shared, ready
workers of each requested machine profile at creation and topped up on every
renewal (a pool created before its workers exist fills up as they register).

Pools reserve capacity, so creating one through the API is refused unless the
operator turned it on (SIE_POOLS_ENABLED), and is bounded: workers per pool,
lease length, lifetime (no renewal carries a pool past SIE_POOL_MAX_LIFETIME_S
from its creation), the pools and the workers all pools of one caller (bearer
token) hold, and the share of each bundle's workers one pool may take; a
number of each bundle's workers always stays shared. A pool is seen, renewed,
deleted and used only with its creator's token.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
from collections import Counter
from collections.abc import Collection, Mapping

from google.protobuf import timestamp_pb2

from sie.v1 import inference_pb2
from sie_common.cluster.cluster_store import POOLS, PoolRecord, WorkerRecord, decode_all, decode_pool, encode_pool
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
            pools, read_at = await self._read_pools()
            self._check_quota(pools.values(), owner, requested)
            lease = await self._etcd.grant_lease(ttl_s)
            workers = self._assign(name, gpus, (), bundle, pools.values())
            now = time.time()
            record = PoolRecord(name, dict(gpus), ttl_s, lease, workers, now + ttl_s, owner, bundle, created_at=now)
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

    async def _read_pools(self) -> tuple[dict[str, PoolRecord], int]:
        """Every pool as etcd has it now (the mirror may lag another gateway's write), and the revision read at."""
        entries, read_at = await self._etcd.read_prefix(POOLS)
        return decode_all({entry.name: entry.value for entry in entries}, decode_pool), read_at

    def _check_quota(self, pools: Collection[PoolRecord], owner: str, requested: int) -> None:
        """RESOURCE_EXHAUSTED when the caller holds as many pools as it may, or its pools would hold more workers than
        its quota."""
        owned = [pool for pool in pools if pool.owner == owner]
        limit = self._settings.pool_quota_pools
        if len(owned) >= limit:
            raise ResourceExhausted(
                f"pool quota: this caller holds {len(owned)} pools and may hold {limit} at once "
                f"(SIE_POOL_QUOTA_POOLS); delete one or let it expire",
                reason="POOL_COUNT_EXCEEDED",
                metadata={"limit": str(limit), "held": str(len(owned))},
            )
        quota = self._quotas.get(owner, self._settings.pool_quota_workers)
        held = sum(sum(pool.gpus.values()) for pool in owned)
        if held + requested > quota:
            raise ResourceExhausted(
                f"pool quota: this caller's pools hold {held} workers and may hold {quota} in all "
                f"(SIE_POOL_QUOTA_WORKERS, SIE_POOL_TOKEN_QUOTAS); delete a pool or ask for fewer",
                reason="POOL_QUOTA_EXCEEDED",
                metadata={"limit": str(quota), "held": str(held), "requested": str(requested)},
            )

    async def renew(self, name: str, token: str | None = None) -> inference_pb2.Pool:
        """Refresh the lease and top up missing workers (saved in etcd), within the pool's lifetime; only the pool's
        owner may."""
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
            self._check_lifetime(record)
            if await self._etcd.keep_alive(record.lease) <= 0:
                raise NotFound(
                    f"pool {name!r} does not exist (or expired)", reason="POOL_NOT_FOUND", metadata={"pool": name}
                )
            pools, _ = await self._read_pools()
            renewed = dataclasses.replace(
                record,
                workers=self._assign(name, record.gpus, record.workers, record.bundle, pools.values()),
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

    def _check_lifetime(self, record: PoolRecord) -> None:
        """FAILED_PRECONDITION when refreshing the lease now would let the pool outlive SIE_POOL_MAX_LIFETIME_S."""
        lifetime = self._settings.pool_max_lifetime_s
        ends_at = record.created_at + lifetime
        if time.time() + record.ttl_s > ends_at:
            left = max(0, round(record.expires_at - time.time()))
            raise FailedPrecondition(
                f"pool {record.name!r} may live {lifetime} s from its creation (SIE_POOL_MAX_LIFETIME_S) and a "
                f"renewal now would carry it past that: it ends at its current expiry (in about {left} s); create "
                f"a new pool to go on",
                reason="POOL_LIFETIME_REACHED",
                metadata={"pool": record.name, "limit": str(lifetime), "expires_in_s": str(left)},
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

    def get(self, name: str, token: str | None) -> inference_pb2.Pool:
        """The pool, to its owner only (another token's get PERMISSION_DENIED, as for renew, delete and use)."""
        check_pool_name(name, self._bounds)
        record = self._view.pools.get(name)
        if record is None:
            raise NotFound(f"pool {name!r} does not exist", reason="POOL_NOT_FOUND", metadata={"pool": name})
        _check_owner(record, token, "see")
        return self.message(record)

    def owned_by(self, token: str | None) -> list[inference_pb2.Pool]:
        """The caller's own pools, by name."""
        owner = pool_owner(token)
        return [self.message(record) for _, record in sorted(self._view.pools.items()) if record.owner == owner]

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

    def _assign(
        self,
        name: str,
        gpus: Mapping[str, int],
        current: tuple[str, ...],
        bundle: str,
        pools: Collection[PoolRecord],
    ) -> tuple[str, ...]:
        """Keep the live workers already assigned and add free shared ones (of `bundle`, when set) up to each
        profile's count, within the operator's limits on each bundle (`_room`); a pool over them gives back its
        last workers. `pools`: every pool as etcd has it."""
        workers = self._view.workers
        taken = {worker for pool in pools if pool.name != name for worker in pool.workers}
        kept = [worker_id for worker_id in current if worker_id in workers]
        free = sorted(
            (
                worker
                for worker in workers.values()
                if worker.ready
                and worker.pool in ("", name)
                and worker.worker_id not in taken
                and worker.worker_id not in kept
            ),
            key=lambda worker: worker.worker_id,
        )
        room = self._room(kept, taken, free)
        held: Counter[str] = Counter()

        def fits(worker: WorkerRecord) -> bool:
            """Whether its bundle has room for one more of this pool's workers (counted when it has)."""
            if held[worker.bundle] >= room[worker.bundle]:
                return False
            held[worker.bundle] += 1
            return True

        assigned = [worker_id for worker_id in kept if fits(workers[worker_id])]
        of_bundle = [worker for worker in free if not bundle or worker.bundle == bundle]
        for profile, count in gpus.items():
            wanted = count - sum(1 for worker_id in assigned if workers[worker_id].machine_profile == profile)
            for worker in of_bundle:
                if wanted > 0 and worker.machine_profile == profile and fits(worker):
                    assigned.append(worker.worker_id)
                    wanted -= 1
        return tuple(assigned)

    def _room(self, kept: Collection[str], taken: Collection[str], free: Collection[WorkerRecord]) -> Counter[str]:
        """Bundle -> the workers of it one pool may hold: SIE_POOL_MAX_SHARE of those pools may take (shared, or in
        a pool created through the API; not an operator's SIE_POOL), and no more than leaves SIE_POOL_SHARED_WORKERS
        of them shared. `kept`: this pool's workers; `taken`: other pools'; `free`: the shared ones."""
        workers = self._view.workers
        poolable = Counter(
            worker.bundle
            for worker in workers.values()
            if worker.pool == "" or worker.worker_id in taken or worker.worker_id in kept
        )
        mine = Counter(workers[worker_id].bundle for worker_id in kept)
        shared = Counter(worker.bundle for worker in free)
        settings = self._settings
        return Counter(
            {
                bundle: min(
                    math.floor(settings.pool_max_share * count + 1e-9),
                    max(0, mine[bundle] + shared[bundle] - settings.pool_shared_workers),
                )
                for bundle, count in poolable.items()
            }
        )
