"""A busy worker keeps its etcd registration (issue 32: a worker's lease expired under load, ~14 load average).

The lease used to be kept alive by a task on the worker's event loop: whenever that loop was held longer than the
TTL (a long synchronous step, or too little CPU for it on a busy two-core machine), the lease expired, the record
disappeared and gateways answered WORKERS_LOST / PROVISIONING until the loop got round to registering again.
The lease now has a thread of its own. These tests hold the event loop that runs the registration (with a
synchronous sleep, or with synchronous reads of etcd) for several TTLs, on a real etcd.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest
from aetcd import rpc

from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, decode_worker
from sie_common.cluster.etcd import Etcd
from sie_worker.cluster.registration import Registration

TTL_S = 2
# Past the 3 TTLs these tests hold the loop for: a held loop is not (yet) a hung one.
LOOP_STALL_S = 30.0


def record() -> WorkerRecord:
    return WorkerRecord(worker_id="busy", address="127.0.0.1:1", bundle="default", machine_profile="cpu")


@pytest.fixture
def kv(etcd_server) -> Iterator[rpc.KVStub]:  # type: ignore[no-untyped-def]
    """A synchronous etcd client: reads that hold the event loop of the test while they run."""
    with grpc.insecure_channel(etcd_server.endpoint.removeprefix("http://")) as channel:
        yield rpc.KVStub(channel)


async def test_an_event_loop_held_for_three_ttls_keeps_the_registration(etcd: Etcd) -> None:
    registration = Registration(etcd, "busy", record, ttl_s=TTL_S, publish_interval_s=0.2, loop_stall_s=LOOP_STALL_S)
    await registration.start()
    try:
        before = await etcd.get(WORKERS + "busy")
        assert before is not None
        time.sleep(3 * TTL_S)  # the event loop is held: no task of it runs meanwhile
        after = await etcd.get(WORKERS + "busy")
        # The same key, never deleted and written again: its lease never expired.
        assert after is not None and after.create_revision == before.create_revision
        assert decode_worker(after.value).worker_id == "busy"
    finally:
        await registration.stop()
    assert await etcd.get(WORKERS + "busy") is None  # a clean stop revokes the lease at once


async def test_an_expired_lease_is_registered_again_at_once_while_the_event_loop_is_held(
    etcd: Etcd, kv: rpc.KVStub
) -> None:
    registration = Registration(etcd, "busy", record, ttl_s=TTL_S, publish_interval_s=0.2, loop_stall_s=LOOP_STALL_S)
    await registration.start()
    try:
        before = await etcd.get(WORKERS + "busy")
        assert before is not None
        key = etcd.key(WORKERS + "busy")
        lease = kv.Range(rpc.RangeRequest(key=key)).kvs[0].lease
        # What an etcd outage longer than the TTL does to the lease: it is gone, and the key with it.
        await etcd.revoke_lease(lease)
        gone_at = time.monotonic()
        back_after = None
        # From here on the event loop is held (these reads are synchronous) until the key is back, or 3 TTLs.
        while time.monotonic() - gone_at < 3 * TTL_S:
            found = kv.Range(rpc.RangeRequest(key=key)).kvs
            if found:
                back_after = time.monotonic() - gone_at
                break
            time.sleep(0.05)
        assert back_after is not None, "not registered again while the event loop was held"
        assert back_after < TTL_S  # within a keep-alive step or two, not at the next publish
        assert found[0].lease != lease
        assert decode_worker(found[0].value) == record()
    finally:
        await registration.stop()
    assert await etcd.get(WORKERS + "busy") is None
