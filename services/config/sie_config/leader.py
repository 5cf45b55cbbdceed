"""Single writer: one replica holds the leader key, bound to its etcd lease and kept alive.

The key is created only when absent, so one replica wins; the others watch it
and try again when it is deleted (the leader resigned, or its lease expired
because it died). Every write is a transaction that also compares the leader
key with this replica's record, so a replica that lost the lease without
noticing cannot write.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

from sie_common.cluster.etcd import Compacted, Etcd, EtcdUnavailable

log = logging.getLogger(__name__)

LEADER = "config/leader"


class LeaderElection:
    def __init__(self, etcd: Etcd, address: str, ttl_s: int, on_elected: Callable[[], Awaitable[None]]) -> None:
        self._etcd = etcd
        self._ttl_s = ttl_s
        self._on_elected = on_elected
        self.replica_id = uuid.uuid4().hex
        self.address = address
        self.record = json.dumps({"replica": self.replica_id, "address": address}).encode()
        self._lease = 0
        self._lease_valid_until = 0.0
        self.leader_address: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def is_leader(self) -> bool:
        # Past the lease's TTL since the last keep-alive answer, etcd may have given the key away.
        return self._lease != 0 and time.monotonic() < self._lease_valid_until

    def guard(self) -> object:
        """A transaction comparison that holds only while this replica is the leader."""
        return self._etcd.ops.value(self._etcd.key(LEADER)) == self.record

    def start(self) -> None:
        self._task = asyncio.create_task(self._campaign(), name="config-leader-election")

    async def stop(self) -> None:
        """Stop campaigning; a leader resigns at once (revokes its lease) so another takes over."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._lease:
            with contextlib.suppress(EtcdUnavailable):
                await self._etcd.revoke_lease(self._lease)
            self._lease = 0

    async def _campaign(self) -> None:
        while True:
            try:
                lease = await self._etcd.grant_lease(self._ttl_s)
                key = self._etcd.key(LEADER)
                won, _ = await self._etcd.txn(
                    [self._etcd.ops.create(key) == 0],
                    [self._etcd.ops.put(key, self.record, lease=lease)],
                )
                if won:
                    await self._lead(lease)
                else:
                    await self._etcd.revoke_lease(lease)
                    await self._follow()
            except (EtcdUnavailable, Compacted) as error:
                log.warning("leader election: %s", error)
            self._lease = 0
            self.leader_address = None
            await asyncio.sleep(min(1.0, self._ttl_s / 3))

    async def _lead(self, lease: int) -> None:
        self._lease = lease
        self._lease_valid_until = time.monotonic() + self._ttl_s
        self.leader_address = self.address
        log.info("this replica (%s) is the config leader", self.address)
        await self._on_elected()
        while True:
            await asyncio.sleep(self._ttl_s / 3)
            sent = time.monotonic()
            try:
                ttl = await self._etcd.keep_alive(lease)
            except EtcdUnavailable as error:
                # Writes stop by themselves once the lease may have run out (is_leader). etcd
                # restores leases when it restarts, so this replica may lead on when it answers.
                log.warning("leader lease keep-alive: %s; retrying", error)
                continue
            if ttl <= 0:
                log.warning("the leader lease expired; stepping down")
                return
            self._lease_valid_until = sent + self._ttl_s

    async def _follow(self) -> None:
        """Wait until the current leader's key goes away."""
        entry, revision = await self._etcd.get_now(LEADER)
        if entry is None:
            return
        # This replica's own key, from a lease it gave up: no one leads until it expires.
        self.leader_address = None if entry.value == self.record else json.loads(entry.value)["address"]
        log.info("following the config leader at %s", self.leader_address)
        # From the read on, not from the key's own (maybe compacted) revision.
        async for batch in self._etcd.watch(LEADER, revision + 1, prefix=False):
            if any(change.value is None for change in batch.changes):
                self.leader_address = None
                return
