"""A worker whose event loop hangs while its lease thread lives withdraws its registration (issue 32).

The lease is kept alive by a thread of its own, so a hung event loop used to keep a ready record: gateways sent the
worker requests that waited to their deadline. The lease thread now asks the loop to run a callback at each renewal;
once one has waited SIE_WORKER_LOOP_STALL_S the lease is revoked (the record goes: gateways send the worker's
requests elsewhere), and the worker registers again once the loop runs.

In process, against the session's real etcd: the registration runs on an event loop of its own thread, and the test
hangs that loop with a synchronous call that blocks until released (what a hung handler or a deadlocked library
call does to a worker), not SIGSTOP (which would stop the lease thread too).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest

from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, decode_worker
from sie_common.cluster.etcd import Etcd
from sie_worker.cluster.registration import Registration

T = TypeVar("T")
TTL_S = 2  # keep-alives (and loop checks) every 0.5 s
STALL_S = 3.0  # well past the 1 s holds below, on a busy machine too


class WorkerLoopThread:
    """An event loop on a thread of its own, standing for the worker's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Awaitable[T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)  # type: ignore[arg-type]

    def hold(self, seconds: float) -> None:
        """Hold the loop with one synchronous call of `seconds` (returns at once)."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


@pytest.fixture
def worker_loop() -> Iterator[WorkerLoopThread]:
    thread = WorkerLoopThread()
    yield thread
    thread.stop()


async def _record(etcd: Etcd) -> WorkerRecord | None:
    entry = await etcd.get(WORKERS + "w1")
    return None if entry is None else decode_worker(entry.value)


async def _until(condition: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> float:
    """Seconds until `condition` holds."""
    started = time.monotonic()
    while not await condition():
        assert time.monotonic() - started < timeout_s, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def test_a_hung_event_loop_withdraws_the_record_and_it_comes_back_when_the_loop_runs(
    etcd_server, etcd_prefix, etcd, worker_loop
) -> None:
    worker_etcd = Etcd([etcd_server.endpoint], etcd_prefix)
    record = WorkerRecord(worker_id="w1", address="127.0.0.1:1", bundle="default", machine_profile="cpu")
    registration = Registration(
        worker_etcd, "w1", lambda: record, ttl_s=TTL_S, publish_interval_s=0.2, loop_stall_s=STALL_S
    )
    worker_loop.run(worker_etcd.connect())
    worker_loop.run(registration.start())
    try:
        assert (await _record(etcd)) == record
        # A busy loop (held 1 s at a time, under the bound) keeps its record all along.
        for _ in range(4):
            worker_loop.hold(1.0)
            for _ in range(10):
                assert (await _record(etcd)) is not None, "a busy but running loop lost its record"
                await asyncio.sleep(0.1)
        # A hung loop: the record goes within the bound and a renewal step or two, while the lease thread lives.
        release = threading.Event()
        worker_loop.loop.call_soon_threadsafe(release.wait)
        gone_after = await _until(lambda: _absent(etcd), timeout_s=10, what="the record to go")
        assert STALL_S - 0.6 <= gone_after <= STALL_S + 3, gone_after
        release.set()
        await _until(lambda: _present(etcd), timeout_s=10, what="the record to come back")
        assert (await _record(etcd)) == record
    finally:
        worker_loop.run(registration.stop())
        worker_loop.run(worker_etcd.close())
    assert (await _record(etcd)) is None


async def _absent(etcd: Etcd) -> bool:
    return (await _record(etcd)) is None


async def _present(etcd: Etcd) -> bool:
    return (await _record(etcd)) is not None
