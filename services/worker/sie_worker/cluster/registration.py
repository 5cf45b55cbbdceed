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
thread's connection too, one call at a time; after a failed call it connects again, trying each of
SIE_ETCD_ENDPOINTS in turn. (A connection stays on the endpoint it first reached: when that member died, the
keep-alives and the refreshes failed for good while the other endpoints served, so the record left etcd after one
TTL and never came back.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, encode_worker
from sie_common.cluster.etcd import Etcd, EtcdUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")

# Keep-alives per TTL: one may fail (or take its whole timeout) and the next still lands in time.
KEEP_ALIVES_PER_TTL = 4
# After a failed keep-alive, the next try comes this soon (not a whole step later), then at doubling intervals up to
# a step (a long etcd outage is not a flood of tries and warnings).
RETRY_S = 0.25


class Registration:
    def __init__(
        self, etcd: Etcd, worker_id: str, record: Callable[[], WorkerRecord], *, ttl_s: int, publish_interval_s: float
    ) -> None:
        self._etcd = etcd
        self._name = WORKERS + worker_id
        self._record = record
        self._ttl_s = ttl_s
        self._publish_interval_s = publish_interval_s
        self._ready = True
        self._keeper: LeaseKeeper | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Register now (so a gateway can route at once), then keep the registration alive and current."""
        value = self._value()
        lease = await self._etcd.grant_lease(self._ttl_s)
        await self._etcd.put(self._name, value, lease=lease)
        log.info("registered %s in etcd (lease TTL %d s)", self._name, self._ttl_s)
        self._keeper = LeaseKeeper(self._etcd, self._name, lease, value, self._ttl_s)
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
        while True:
            await asyncio.sleep(self._publish_interval_s)
            try:
                await self.publish()
            except EtcdUnavailable as error:  # the lease may have just been replaced: the next refresh uses the new
                log.warning("worker registration: %s; retrying", error)
            except Exception:  # nothing may end the refreshes: gateways would route on a stale record
                log.exception("worker registration failed unexpectedly; retrying")


class LeaseKeeper:
    """Keeps one registration's lease alive from a thread of its own (its own event loop and etcd client); registers
    `value` again under a new lease if the lease expired anyway. `lease` is the one to write the record under.

    The thread's event loop runs until the process ends (a grpc.aio channel belongs to one event loop, and grpc
    reports events for a loop that was closed as errors); `stop` ends the keep-alives, revokes the lease and closes
    the connection. Its etcd calls take turns (`_calls`): one that fails closes the connection, which another call
    must not be using."""

    def __init__(self, etcd: Etcd, name: str, lease: int, value: bytes, ttl_s: int) -> None:
        self.lease = lease
        self.value = value
        self._name = name
        self._ttl_s = ttl_s
        self._step_s = ttl_s / KEEP_ALIVES_PER_TTL
        # A call gives up after a third of the TTL: a slow etcd gets that long to answer, and a call lost on a broken
        # connection leaves time for another try before the lease runs out.
        self._etcd = Etcd(etcd.endpoints, etcd.prefix, credentials=etcd.credentials, tls=etcd.tls, timeout_s=ttl_s / 3)
        self._connected = False
        self._calls: asyncio.Lock | None = None  # made on the thread's loop
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sie-worker-lease", daemon=True)
        self._task: asyncio.Task[None] | None = None

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
        self._calls = asyncio.Lock()
        self._task = asyncio.create_task(self._keep_alive())

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self._call(lambda: self._etcd.revoke_lease(self.lease))
        except EtcdUnavailable as error:
            log.warning("could not revoke the worker lease (the record goes when it expires): %s", error)
        await self._etcd.close()

    async def _publish(self, value: bytes) -> None:
        self.value = value  # what the keeper registers again with, should the lease expire
        await self._call(lambda: self._etcd.put(self._name, value, lease=self.lease))

    async def _call(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call` on this thread's connection (connecting first if need be), one at a time; a failure closes the
        connection, so that the next call connects again, to whichever endpoint answers."""
        assert self._calls is not None
        async with self._calls:
            try:
                if not self._connected:
                    await self._etcd.connect()
                    self._connected = True
                return await call()
            except EtcdUnavailable:
                self._connected = False
                await self._etcd.close()
                raise

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._step_s)
            delay = RETRY_S
            while not await self._refreshed():
                await asyncio.sleep(delay)
                delay = min(2 * delay, self._step_s)

    async def _refreshed(self) -> bool:
        """One keep-alive (a new lease and the record again if it had expired); False if etcd did not answer."""
        started = time.monotonic()
        try:
            if await self._call(lambda: self._etcd.keep_alive(self.lease)) > 0:
                return True
            log.warning("worker lease expired (etcd unreachable for longer than its TTL?); registering again")
            lease = await self._call(lambda: self._etcd.grant_lease(self._ttl_s))
            await self._call(lambda: self._etcd.put(self._name, self.value, lease=lease))
            self.lease = lease
            log.info("registered %s in etcd again (lease TTL %d s)", self._name, self._ttl_s)
            return True
        except EtcdUnavailable as error:
            log.warning("worker lease keep-alive failed after %.1f s: %s; retrying", time.monotonic() - started, error)
        except Exception:  # nothing may end the keep-alives: the registration would be lost for good
            log.exception("worker lease keep-alive failed unexpectedly; retrying")
        return False
