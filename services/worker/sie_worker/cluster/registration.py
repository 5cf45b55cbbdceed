"""This worker's registration in etcd (cluster mode): `workers/<worker id>` under a lease.

The record is refreshed every SIE_HEALTH_PUBLISH_INTERVAL_MS with what gateways route on: loaded models, queue
depth, free capacity, bundle config hash, readiness. If the worker dies its lease runs out and the key disappears.
On SIGTERM the worker first publishes that it is draining (`ready` false: gateways send it nothing new but keep
its Work streams open for the requests already on them) and revokes the lease only once it has drained.

The lease is kept alive by a thread of its own, with its own event loop and etcd connection (`LeaseKeeper`), so a
worker whose event loop is busy (a long synchronous step, many requests on two cores) does not lose its
registration: only the lease is time-critical, and that thread does nothing else. It renews four times per TTL, each
call giving up after a third of the TTL, and tries a failed renewal again 0.25 s later (then at doubling intervals
up to a quarter of the TTL), so one slow or lost call never costs the lease. (The keep-alive used to be a task on
the event loop, every third of the TTL with 5 s calls and a whole third of the TTL between a failure and the next
try: with the default 10 s TTL, one keep-alive that hung cost the lease, as did the event loop being held for a
TTL.) If the lease is found expired anyway (etcd unreachable longer than the TTL), that thread registers again at
once, with the record last published.

Every write of the record after the first (the refreshes, the draining record) and the final revoke go through that
thread's connection too. Like every etcd connection, it fails over between SIE_ETCD_ENDPOINTS (after a failed call
the next goes to the next endpoint that answers: `sie_common.cluster.etcd`).

The first registration replaces whatever record the worker id had: a new process of the same id (a restart on
another address while the old one drains) takes the id over. Every later write goes through only while the key is
still under this process's lease, and registering again after an expiry only while the key is absent, so the old
process's refreshes and draining record do not overwrite the new one's (gateways finish the old process's requests
on its address and send new ones to the new address).

A process that finds its worker id's record under another lease (a write of its record refused, or a registration
again after an expiry refused) no longer owns the id: it says so in its log (naming the address the record now
has), revokes its own lease, writes and renews nothing more, and calls `on_superseded` (the worker then drains and
exits 0, as on SIGTERM). Before, a live duplicate kept renewing a lease that held no key, for as long as it ran.
A registration again whose answer was lost (etcd applied it, then the member died or the call timed out) leaves the
record under a lease the keeper granted but did not get to keep: found there, it is adopted, not taken for another
process's (it was, and the worker stopped itself, leaving its own ready record for a TTL).

A worker whose event loop hangs while the lease thread lives would keep a ready record, and gateways would send it
requests that wait to their deadline. The lease thread checks at each renewal that the loop runs (`WorkerLoop`: the
loop is asked to run a callback, and is stalled once one has waited SIE_WORKER_LOOP_STALL_S); a stalled worker
revokes its lease (the record goes, gateways send its requests elsewhere) and registers again once the loop runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, decode_worker, encode_worker
from sie_common.cluster.etcd import Etcd, EtcdUnavailable

log = logging.getLogger(__name__)

# Keep-alives per TTL: one may fail (or take its whole timeout) and the next still lands in time.
KEEP_ALIVES_PER_TTL = 4
# After a failed keep-alive, the next try comes this soon (not a whole step later), then at doubling intervals up to
# a step (a long etcd outage is not a flood of tries and warnings).
RETRY_S = 0.25


class Registration:
    def __init__(
        self,
        etcd: Etcd,
        worker_id: str,
        record: Callable[[], WorkerRecord],
        *,
        ttl_s: int,
        publish_interval_s: float,
        loop_stall_s: float,
        on_superseded: Callable[[], None] = lambda: None,
    ) -> None:
        """`on_superseded` runs on the worker's event loop once another process has taken the worker id over (the
        worker stops)."""
        self._etcd = etcd
        self._name = WORKERS + worker_id
        self._record = record
        self._ttl_s = ttl_s
        self._publish_interval_s = publish_interval_s
        self._loop_stall_s = loop_stall_s
        self._on_superseded = on_superseded
        self._ready = True
        self._keeper: LeaseKeeper | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register now (so a gateway can route at once), then keep the registration alive and current."""
        value = self._value()
        lease = await self._etcd.grant_lease(self._ttl_s)
        await self._etcd.put(self._name, value, lease=lease)
        log.info("registered %s in etcd (lease TTL %d s)", self._name, self._ttl_s)
        loop = asyncio.get_running_loop()
        worker_loop = WorkerLoop(loop, self._loop_stall_s)

        def superseded() -> None:  # (called on the keeper's thread)
            loop.call_soon_threadsafe(self._on_superseded)

        self._keeper = LeaseKeeper(self._etcd, self._name, lease, value, self._ttl_s, worker_loop, superseded)
        self._keeper.start()
        self._task = asyncio.create_task(self._refresh(), name="worker-registration")

    async def publish(self) -> None:
        """Write the current record now (e.g. right after a model loads, or when draining starts)."""
        assert self._keeper is not None, "publish() before start()"
        await self._keeper.publish(self._value())

    async def drain(self) -> None:
        """Say this worker is draining (`ready` false): gateways route nothing new here, and keep the streams that
        carry what it still has to answer. The lease stays alive until `stop`."""
        self._ready = False
        try:
            await self.publish()
        except EtcdUnavailable as error:
            log.warning("could not publish that this worker is draining: %s", error)
        except Exception:  # the drain goes on regardless: a gateway that routes here is refused SHUTTING_DOWN
            log.exception("could not publish that this worker is draining")

    async def stop(self) -> None:
        """Deregister: stop refreshing and revoke the lease, which deletes the key."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._keeper is not None:
            await self._keeper.stop()

    def _value(self) -> bytes:
        return encode_worker(dataclasses.replace(self._record(), ready=self._ready))

    async def _refresh(self) -> None:
        while not self._keeper or not self._keeper.superseded:
            await asyncio.sleep(self._publish_interval_s)
            try:
                await self.publish()
            except EtcdUnavailable as error:  # the lease may have just been replaced: the next refresh uses the new
                log.warning("worker registration: %s; retrying", error)
            except Exception:  # nothing may end the refreshes: gateways would route on a stale record
                log.exception("worker registration failed unexpectedly; retrying")


class LeaseKeeper:
    """Keeps one registration's lease alive from a thread of its own (its own event loop and etcd client); registers
    `value` again under a new lease if the lease expired anyway. `lease` is the one to write the record under. Once
    the record is found under another process's lease, it stops for good (`superseded`) and calls `on_superseded`
    (from its own thread).

    The thread's event loop runs until the process ends (a grpc.aio channel belongs to one event loop, and grpc
    reports events for a loop that was closed as errors); `stop` ends the keep-alives, revokes the lease and closes
    the connection."""

    def __init__(
        self,
        etcd: Etcd,
        name: str,
        lease: int,
        value: bytes,
        ttl_s: int,
        worker_loop: WorkerLoop,
        on_superseded: Callable[[], None],
    ) -> None:
        self.lease = lease
        self.value = value
        self.superseded = False
        self._on_superseded = on_superseded
        self._name = name
        self._ttl_s = ttl_s
        self._step_s = ttl_s / KEEP_ALIVES_PER_TTL
        self._worker_loop = worker_loop
        self._withdrawn = False
        # A call gives up after a third of the TTL: a slow etcd gets that long to answer, and a call lost on a broken
        # connection leaves time for another try before the lease runs out.
        self._etcd = Etcd(etcd.endpoints, etcd.prefix, credentials=etcd.credentials, tls=etcd.tls, timeout_s=ttl_s / 3)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sie-worker-lease", daemon=True)
        self._task: asyncio.Task[None] | None = None
        # Held while the record is written or registered again: a write that finds the key under another lease then
        # knows it is not this process's own registration under way.
        self._writing: asyncio.Lock | None = None
        # The lease of a registration again whose answer was lost (etcd may have applied it): the record found under
        # it is this process's own, not another's.
        self._unanswered: int | None = None

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()

    async def publish(self, value: bytes) -> None:
        """Write `value` under the lease now, and register again with it should the lease expire (from any event
        loop); raises EtcdUnavailable if etcd did not take it."""
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._publish(value), self._loop))

    async def stop(self) -> None:
        """Stop keeping the lease alive and revoke it (which deletes the record), if etcd answers."""
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._stop(), self._loop))

    async def _start(self) -> None:
        self._writing = asyncio.Lock()
        self._task = asyncio.create_task(self._keep_alive())

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.superseded:  # (a superseded keeper revoked its lease already)
            try:
                await self._etcd.revoke_lease(self.lease)
            except EtcdUnavailable as error:
                log.warning("could not revoke the worker lease (the record goes when it expires): %s", error)
        await self._etcd.close()

    async def _publish(self, value: bytes) -> None:
        self.value = value  # what the keeper registers again with, should the lease expire
        etcd = self._etcd
        assert self._writing is not None
        async with self._writing:
            if self.superseded:
                return
            ours, _ = await etcd.txn(
                [etcd.held_by(self._name, self.lease)], [etcd.ops.put(etcd.key(self._name), value, lease=self.lease)]
            )
            if ours or await self._adopted(value):
                return
            holder = await etcd.get(self._name)
            if holder is not None:  # under another lease, and not one this keeper is registering with (the lock)
                await self._give_up(holder.value)
                return
        log.info("%s is not under this worker's lease (the lease ended): not written", self._name)

    async def _adopted(self, value: bytes) -> bool:
        """Whether the record is under the lease of this keeper's registration again whose answer was lost (etcd
        applied it after all): then `value` is written under that lease, which becomes this keeper's. (Without this,
        the keeper found its own record under a lease it did not know, and stopped the worker as superseded.)"""
        lease = self._unanswered
        if lease is None:
            return False
        etcd = self._etcd
        ours, _ = await etcd.txn(
            [etcd.held_by(self._name, lease)], [etcd.ops.put(etcd.key(self._name), value, lease=lease)]
        )
        self._unanswered = None  # answered: the record is under it, or that lease holds nothing and only expires
        if ours:
            self.lease = lease
            log.info("%s was registered again after all (the answer was lost): keeping its lease alive", self._name)
        return ours

    async def _give_up(self, record: bytes) -> None:
        """Another process registered this worker id (its `record`): write and renew nothing more, revoke this
        process's lease, and say so."""
        self.superseded = True
        try:
            address = decode_worker(record).address
        except (ValueError, TypeError):
            address = "an address this worker cannot read"
        log.warning(
            "%s is now registered by another process (at %s): this process no longer owns the worker id, stops "
            "renewing its lease and stops",
            self._name,
            address,
        )
        with contextlib.suppress(EtcdUnavailable):  # it holds no key: left alone, it only expires
            await self._etcd.revoke_lease(self.lease)
        self._on_superseded()

    async def _keep_alive(self) -> None:
        while not self.superseded:
            await asyncio.sleep(self._step_s)
            if self.superseded or not await self._worker_loop_runs():
                continue
            delay = RETRY_S
            while not await self._refreshed() and not self.superseded:
                await asyncio.sleep(delay)
                delay = min(2 * delay, self._step_s)

    async def _worker_loop_runs(self) -> bool:
        """Whether the worker's event loop runs; the first time it is found stalled, the lease is revoked (the record
        goes: gateways stop routing here and send what they had sent here elsewhere). The lease is kept alive no
        more until the loop runs again; the next keep-alive then finds it gone and registers again."""
        if self._worker_loop.runs():
            if self._withdrawn:
                log.warning("the worker's event loop runs again; registering again")
                self._withdrawn = False
            return True
        if not self._withdrawn:
            log.error(
                "the worker's event loop has not run for %.0f s: withdrawing the registration until it runs again",
                self._worker_loop.stalled_s(),
            )
            try:
                await self._etcd.revoke_lease(self.lease)
                self._withdrawn = True
            except EtcdUnavailable as error:
                log.warning("could not withdraw the registration of a stalled worker: %s; retrying", error)
        return False

    async def _refreshed(self) -> bool:
        """One keep-alive (a new lease and the record again if it had expired); False if etcd did not answer."""
        started = time.monotonic()
        try:
            if await self._etcd.keep_alive(self.lease) > 0:
                return True
            assert self._writing is not None
            async with self._writing:
                if self.superseded:
                    return True
                if await self._adopted(self.value):
                    return await self._etcd.keep_alive(self.lease) > 0
                log.warning("worker lease expired (etcd unreachable for longer than its TTL?); registering again")
                etcd = self._etcd
                lease = await etcd.grant_lease(self._ttl_s)
                key = etcd.key(self._name)
                self._unanswered = lease
                registered, _ = await etcd.txn(
                    [etcd.ops.version(key) == 0], [etcd.ops.put(key, self.value, lease=lease)]
                )
                self._unanswered = None
                if not registered:  # another process registered this worker id since: it keeps the record
                    await etcd.revoke_lease(lease)
                    holder = await etcd.get(self._name)
                    if holder is not None:
                        await self._give_up(holder.value)
                    return True
                self.lease = lease
            log.info("registered %s in etcd again (lease TTL %d s)", self._name, self._ttl_s)
            return True
        except EtcdUnavailable as error:
            log.warning("worker lease keep-alive failed after %.1f s: %s; retrying", time.monotonic() - started, error)
        except Exception:  # nothing may end the keep-alives: the registration would be lost for good
            log.exception("worker lease keep-alive failed unexpectedly; retrying")
        return False


class WorkerLoop:
    """Whether the worker's event loop still runs, as seen from another thread: each look asks the loop to run a
    callback, and the loop is stalled once one it was asked to run has waited longer than `stall_s`. (The lease
    keeper's thread runs whatever the worker's loop does; without this, a worker whose loop hung kept a ready
    record, and gateways sent it requests that waited to their deadline.)"""

    def __init__(self, loop: asyncio.AbstractEventLoop, stall_s: float) -> None:
        self._loop = loop
        self._stall_s = stall_s
        self._asked_at: float | None = None  # when the callback not yet run was asked for

    def runs(self) -> bool:
        if self._asked_at is None:
            if self._loop.is_closed():
                return True  # the worker is stopping
            self._asked_at = time.monotonic()
            self._loop.call_soon_threadsafe(self._ran)
            return True
        return self.stalled_s() <= self._stall_s

    def stalled_s(self) -> float:
        """How long the callback the loop was asked to run has waited (0: it ran)."""
        asked_at = self._asked_at
        return 0.0 if asked_at is None else time.monotonic() - asked_at

    def _ran(self) -> None:
        self._asked_at = None
