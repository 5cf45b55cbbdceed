"""The engine's one door to etcd v3: reads at a revision, guarded transactions, leases, watches.

Wraps `aetcd` (its connection, transactions and leases) and, where aetcd has
no API for it, the etcd gRPC stubs it ships: ranges read at a given revision,
and watches that hand over each etcd response as one batch with its revision
and report compaction as `Compacted`. Every key is a name under one prefix
(`SIE_ETCD_PREFIX`, default `/sie/`); the layout is in docs/control-plane.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aetcd
import aetcd.exceptions
from aetcd import rpc
from aetcd.utils import prefix_range_end

from sie_common.runtime.transport import RECONNECT_OPTIONS

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/sie/"


class EtcdUnavailable(ConnectionError):
    """etcd could not be reached or answered with an error; callers retry."""


class Compacted(Exception):
    """The revision a watch should resume from was compacted: read everything again."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd history compacted up to revision {compact_revision}")
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class Entry:
    """One key as read: its name under the prefix, value and revisions."""

    name: str
    value: bytes
    mod_revision: int
    create_revision: int


@dataclass(frozen=True)
class Change:
    """One watched change: `value` None means the key was deleted."""

    name: str
    value: bytes | None
    revision: int


@dataclass(frozen=True)
class WatchBatch:
    """The changes etcd sent together (empty on progress notifications); `revision`: all up to it are seen."""

    revision: int
    changes: tuple[Change, ...]


class Etcd:
    """A connection to etcd whose keys are names under `prefix`."""

    def __init__(self, endpoints: Sequence[str], prefix: str = DEFAULT_PREFIX, *, timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints given (SIE_ETCD_ENDPOINTS)")
        self.endpoints = tuple(endpoints)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self._timeout_s = timeout_s
        self._client: aetcd.Client | None = None

    async def connect(self) -> None:
        """Connect to the first endpoint that answers."""
        errors = []
        for endpoint in self.endpoints:
            host, _, port = endpoint.removeprefix("http://").rpartition(":")
            client = aetcd.Client(
                host=host or "localhost", port=int(port), timeout=self._timeout_s, options=RECONNECT_OPTIONS
            )
            try:
                await client.connect()
                await client.kvstub.Range(rpc.RangeRequest(key=b"\0", count_only=True), timeout=self._timeout_s)
            except Exception as error:  # noqa: BLE001 - any failure means: try the next endpoint
                errors.append(f"{endpoint}: {error}")
                await client.close()
                continue
            self._client = client
            return
        raise EtcdUnavailable("cannot reach etcd at " + "; ".join(errors))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    @property
    def client(self) -> aetcd.Client:
        if self._client is None:
            raise EtcdUnavailable("not connected to etcd")
        return self._client

    @property
    def ops(self) -> aetcd.client.Transactions:
        """Comparison and operation builders for `txn` (value, version, create, mod, put, get, delete)."""
        return self.client.transactions

    def key(self, name: str) -> bytes:
        return (self.prefix + name).encode()

    def unchanged_since(self, name_prefix: str, revision: int) -> aetcd.transactions.Mod:
        """A `txn` comparison that holds while no key under `name_prefix` was written after `revision`."""
        key = self.key(name_prefix)
        return self.ops.mod(key, prefix_range_end(key)) < revision + 1

    def _name(self, key: bytes) -> str:
        return key.decode()[len(self.prefix) :]

    async def get(self, name: str, revision: int = 0) -> Entry | None:
        """One key as of `revision` (0: now)."""
        entries, _ = await self._range(self.key(name), None, revision)
        return entries[0] if entries else None

    async def get_now(self, name: str) -> tuple[Entry | None, int]:
        """One key as of now, and the revision it was read at (to watch it from the next one)."""
        entries, revision = await self._range(self.key(name), None, 0)
        return (entries[0] if entries else None), revision

    async def read_prefix(self, name_prefix: str, revision: int = 0) -> tuple[list[Entry], int]:
        """Every key under `name_prefix` as of `revision` (0: now), and the revision read at."""
        key = self.key(name_prefix)
        return await self._range(key, prefix_range_end(key), revision)

    async def _range(self, key: bytes, range_end: bytes | None, revision: int) -> tuple[list[Entry], int]:
        request = rpc.RangeRequest(key=key, range_end=range_end or b"", revision=revision)
        try:
            reply = await self.client.kvstub.Range(request, timeout=self._timeout_s)
        except rpc.AioRpcError as error:
            if "compacted" in (error.details() or ""):
                raise Compacted(revision) from error
            raise EtcdUnavailable(f"etcd range read failed: {error.details()}") from error
        entries = [Entry(self._name(kv.key), kv.value, kv.mod_revision, kv.create_revision) for kv in reply.kvs]
        return entries, reply.header.revision

    async def txn(self, compare: list, success: list, failure: list | None = None) -> tuple[bool, int]:
        """Apply `success` if every comparison holds (else `failure`); returns (succeeded, revision after)."""
        request = rpc.TxnRequest(
            compare=[c.build_message() for c in compare],
            success=self.client._ops_to_requests(success),
            failure=self.client._ops_to_requests(failure or []),
        )
        try:
            reply = await self.client.kvstub.Txn(request, timeout=self._timeout_s)
        except rpc.AioRpcError as error:
            raise EtcdUnavailable(f"etcd transaction failed: {error.details()}") from error
        return reply.succeeded, reply.header.revision

    async def put(self, name: str, value: bytes, lease: int = 0) -> int:
        """Write one key unconditionally; returns the revision of the write."""
        _, revision = await self.txn([], [self.ops.put(self.key(name), value, lease=lease)])
        return revision

    async def delete(self, name: str) -> int:
        """Delete one key; returns the revision after."""
        _, revision = await self.txn([], [self.ops.delete(self.key(name))])
        return revision

    async def grant_lease(self, ttl_s: int) -> int:
        try:
            return (await self.client.lease(ttl_s)).id
        except aetcd.exceptions.ClientError as error:
            raise EtcdUnavailable(f"etcd lease grant failed: {error}") from error

    async def keep_alive(self, lease_id: int) -> int:
        """Refresh a lease once; returns its TTL in seconds (0: it has expired)."""
        try:
            reply = await self.client.refresh_lease(lease_id)
        except aetcd.exceptions.ClientError as error:
            raise EtcdUnavailable(f"etcd lease keep-alive failed: {error}") from error
        return reply.TTL if reply is not None else 0

    async def revoke_lease(self, lease_id: int) -> None:
        try:
            await self.client.revoke_lease(lease_id)
        except aetcd.exceptions.ClientError as error:
            raise EtcdUnavailable(f"etcd lease revoke failed: {error}") from error

    async def compact(self, revision: int) -> None:
        await self.client.compact(revision, physical=True)

    async def watch(self, name: str, start_revision: int, *, prefix: bool = True) -> AsyncIterator[WatchBatch]:
        """Changes to `name` (and, with `prefix`, every key under it) from `start_revision` on.

        Raises `Compacted` when that revision is no longer in etcd's history and
        `EtcdUnavailable` when the stream breaks; both end the iteration.
        """
        key = self.key(name)
        create = rpc.WatchCreateRequest(
            key=key,
            range_end=prefix_range_end(key) if prefix else b"",
            start_revision=start_revision,
            progress_notify=True,
        )
        stop = asyncio.Event()

        async def requests() -> AsyncIterator[rpc.WatchRequest]:
            yield rpc.WatchRequest(create_request=create)
            await stop.wait()  # half-closing would end the watch

        stream = rpc.WatchStub(self.client.channel).Watch(requests())
        try:
            async for reply in stream:
                if reply.compact_revision:
                    raise Compacted(reply.compact_revision)
                if reply.canceled:
                    raise EtcdUnavailable(f"etcd canceled the watch: {reply.cancel_reason}")
                if reply.created and not reply.events:
                    continue
                changes = tuple(
                    Change(
                        self._name(event.kv.key),
                        None if event.type == rpc.Event.DELETE else event.kv.value,
                        event.kv.mod_revision,
                    )
                    for event in reply.events
                )
                # A progress notification's header says every change up to it was sent;
                # an event batch vouches only for its own events' revisions.
                revision = max(change.revision for change in changes) if changes else reply.header.revision
                yield WatchBatch(revision, changes)
        except rpc.AioRpcError as error:
            raise EtcdUnavailable(f"etcd watch stream broke: {error.code().name} {error.details()}") from error
        finally:
            stop.set()
            stream.cancel()
