"""A worker process whose id another process has taken over (a second process started with the same SIE_WORKER_ID,
which replaces the record) notices that it no longer owns its record: it says so, naming the address the record now
has, writes and renews nothing more, and drains and exits 0. Before, a live duplicate kept renewing a lease that held
no key for as long as it ran (and logged a line at each of its record's refreshes). Real etcd, real worker processes;
the keeper's path that registers again after an expiry, in-process against the same etcd."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from local_cluster import wait_until
from reliability.slow_worker import registered
from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, decode_worker, encode_worker
from sie_worker.cluster.registration import LeaseKeeper, WorkerLoop

pytestmark = pytest.mark.process


def test_a_live_duplicate_of_a_worker_id_stops_once_another_process_holds_its_record(cluster) -> None:
    first = cluster.start_worker("w1")
    second = cluster.start_worker("w1")  # same id, another port: it replaces the record
    assert second.address != first.address
    wait_until(
        lambda: (record := registered(cluster).get("w1")) is not None and record.address == second.address,
        what="the second process's record",
    )
    # The first process finds its record under another lease at its next refresh (every 200 ms): it stops.
    assert first.process.wait(timeout=60) == 0
    log = first.log()  # (both processes log to the id's file)
    assert f"workers/w1 is now registered by another process (at {second.address})" in log, log[-3000:]
    assert "stops renewing its lease and stops" in log
    assert "Traceback" not in log
    # Its stop took nothing from the new owner: the record is the second process's, ready, and stays.
    time.sleep(1)
    record = registered(cluster).get("w1")
    assert record is not None and (record.address, record.ready) == (second.address, True)
    assert second.process.poll() is None


def record(address: str) -> bytes:
    return encode_worker(WorkerRecord(worker_id="w1", address=address, bundle="default", machine_profile="cpu"))


async def test_a_keeper_that_finds_its_id_taken_when_it_registers_again_gives_up(etcd, caplog) -> None:
    """The lease ran out (etcd unreachable for a TTL, or withdrawn while the event loop stalled) and another process
    registered the id meanwhile: the keeper's registration again is refused, and it gives up instead of trying again
    at every keep-alive for as long as it runs."""
    name = WORKERS + "w1"
    lease = await etcd.grant_lease(2)
    await etcd.put(name, record("127.0.0.1:1"), lease=lease)
    superseded = threading.Event()
    keeper = LeaseKeeper(etcd, name, lease, record("127.0.0.1:1"), 2, WorkerLoop(asyncio.get_running_loop(), 30), superseded.set)
    keeper.start()
    try:
        await etcd.revoke_lease(lease)  # as if it had expired
        other = await etcd.grant_lease(30)
        await etcd.put(name, record("127.0.0.1:2"), lease=other)
        assert await asyncio.to_thread(superseded.wait, 15), "the keeper did not give up"
        assert keeper.superseded
        await keeper.publish(record("127.0.0.1:1"))  # written no more
        await asyncio.sleep(1.5)  # three keep-alive steps: no keep-alive, no registration again
        entry = await etcd.get(name)
        assert entry is not None and decode_worker(entry.value).address == "127.0.0.1:2"
        tries = [r for r in caplog.records if r.getMessage().startswith("worker lease expired")]
        assert len(tries) == 1, [r.getMessage() for r in caplog.records]
    finally:
        await keeper.stop()
