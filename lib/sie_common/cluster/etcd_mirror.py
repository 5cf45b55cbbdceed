"""A local mirror of one etcd prefix, kept current by watching it (gateways and workers).

Read everything, then watch from the next revision. After a broken stream the
watch resumes from the last revision seen; after a compaction took that
history away, everything is read again and replaces the mirror. A change at
or below the mirror's revision is never applied twice, so every update the
callback sees moves the revision forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from sie_common.cluster.etcd import Change, Compacted, Etcd, EtcdUnavailable, WatchBatch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MirrorUpdate:
    """What changed, at `revision`; `state` is a read-only view of the whole mirrored state (no copy:
    applying a change must cost the same however many keys are mirrored)."""

    revision: int
    state: Mapping[str, bytes]
    # Empty after a full read (`full_read`), which replaces the state wholesale.
    changes: tuple[Change, ...]
    full_read: bool


Apply = Callable[[MirrorUpdate], Awaitable[None] | None]


class PrefixMirror:
    """Keys under `name_prefix` (names relative to it) -> values, as of `revision`."""

    def __init__(self, etcd: Etcd, name_prefix: str, apply: Apply | None = None, *, retry_s: float = 0.5) -> None:
        self._etcd = etcd
        self._prefix = name_prefix
        self._apply = apply
        self._retry_s = retry_s
        self._task: asyncio.Task[None] | None = None
        self._advanced = asyncio.Condition()
        self.state: dict[str, bytes] = {}
        self.revision = 0
        self.full_reads = 0

    async def start(self) -> None:
        """Start (or resume after `stop`) following etcd; returns after the first read."""
        if self.revision == 0:
            await self._full_read()
        self._task = asyncio.create_task(self._follow(), name=f"etcd-mirror:{self._prefix}")

    async def stop(self) -> None:
        """Stop watching; the state and revision are kept, so `start` resumes from them."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def wait_for(self, revision: int, timeout_s: float) -> None:
        """Return once the mirror has seen `revision` (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout_s):
            async with self._advanced:
                await self._advanced.wait_for(lambda: self.revision >= revision)

    async def _follow(self) -> None:
        while True:
            try:
                async for batch in self._etcd.watch(self._prefix, self.revision + 1):
                    await self._apply_batch(batch)
            except Compacted as error:
                log.info("etcd mirror %s: %s; reading everything again", self._prefix, error)
                await self._retrying(self._full_read)
            except EtcdUnavailable as error:
                log.warning("etcd mirror %s: %s; resuming from revision %d", self._prefix, error, self.revision)
                await asyncio.sleep(self._retry_s)
            except Exception:
                log.exception(
                    "etcd mirror %s: unexpected failure; resuming from revision %d", self._prefix, self.revision
                )
                await asyncio.sleep(self._retry_s)

    async def _retrying(self, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                return await step()
            except EtcdUnavailable as error:
                log.warning("etcd mirror %s: %s; retrying", self._prefix, error)
                await asyncio.sleep(self._retry_s)

    async def _full_read(self) -> None:
        entries, revision = await self._etcd.read_prefix(self._prefix)
        self.state = {entry.name[len(self._prefix) :]: entry.value for entry in entries}
        self.full_reads += 1
        await self._advance(MirrorUpdate(revision, MappingProxyType(self.state), (), True))

    async def _apply_batch(self, batch: WatchBatch) -> None:
        fresh = []
        for change in batch.changes:
            if change.revision <= self.revision:
                continue  # already in the state (read or applied before)
            name = change.name[len(self._prefix) :]
            if change.value is None:
                self.state.pop(name, None)
            else:
                self.state[name] = change.value
            fresh.append(Change(name, change.value, change.revision))
        if batch.revision <= self.revision:
            return
        await self._advance(MirrorUpdate(batch.revision, MappingProxyType(self.state), tuple(fresh), False))

    async def _advance(self, update: MirrorUpdate) -> None:
        self.revision = update.revision
        if self._apply is not None and (update.changes or update.full_read):
            try:
                result = self._apply(update)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("etcd mirror %s: applying revision %d failed", self._prefix, update.revision)
        async with self._advanced:
            self._advanced.notify_all()
