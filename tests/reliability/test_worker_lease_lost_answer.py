"""A worker whose registration again (after its lease expired) went through at etcd but whose answer was lost (the
member it spoke to died or stalled past the call timeout once it had applied the write: a failover mid-renewal) is
still the owner of its worker id: it keeps its record and renews the lease it is under.

Before, the keeper knew only the old, expired lease: at its next try (or the worker's next refresh of the record) it
found the record under a lease it did not know, took it for another process's, and stopped the worker (drained,
exit 0), leaving its own record in etcd, ready, for a lease TTL. Real etcd; the keeper in-process, with one answer
of etcd's dropped after etcd applied the call (as the client sees a call that timed out)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, decode_worker, encode_worker
from sie_common.cluster.etcd import Etcd, EtcdUnavailable
from sie_worker.cluster.registration import LeaseKeeper, WorkerLoop

pytestmark = pytest.mark.process

TTL_S = 2
ADDRESS = "127.0.0.1:1"


def record(ready: bool = True) -> bytes:
    return encode_worker(
        WorkerRecord(worker_id="w1", address=ADDRESS, bundle="default", machine_profile="cpu", ready=ready)
    )


def lose_the_answer_of_the_registration_again(keeper: LeaseKeeper) -> threading.Event:
    """The keeper's first transaction that registers again (its key absent) reaches etcd, and its answer is lost:
    EtcdUnavailable, as for a call past its timeout. The event is set once that happened."""
    client: Etcd = keeper._etcd
    applied = client.txn
    lost = threading.Event()

    async def txn(compare: list, success: list, failure: list | None = None) -> tuple[bool, int]:
        answer = await applied(compare, success, failure)
        registers_again = any(c.build_message().target == c.build_message().VERSION for c in compare)
        if registers_again and answer[0] and not lost.is_set():
            lost.set()
            raise EtcdUnavailable("etcd a transaction failed: DEADLINE_EXCEEDED (its answer was lost)")
        return answer

    client.txn = txn  # type: ignore[method-assign]
    return lost


@pytest.mark.parametrize("refreshed_first", [False, True], ids=["keeper tries again first", "record refreshed first"])
async def test_a_registration_again_whose_answer_was_lost_keeps_the_worker(etcd, refreshed_first) -> None:
    name = WORKERS + "w1"
    lease = await etcd.grant_lease(TTL_S)
    await etcd.put(name, record(), lease=lease)
    superseded = threading.Event()
    keeper = LeaseKeeper(etcd, name, lease, record(), TTL_S, WorkerLoop(asyncio.get_running_loop(), 30), superseded.set)
    lost = lose_the_answer_of_the_registration_again(keeper)
    keeper.start()
    try:
        await etcd.revoke_lease(lease)  # as if it had expired: the record goes, the keeper registers again
        assert await asyncio.to_thread(lost.wait, 15), "the keeper did not register again"
        if refreshed_first:  # the worker's refresh of its record comes before the keeper's next try
            await keeper.publish(record())
        # Three lease TTLs: the record stays, under a lease kept alive, and the worker is not told to stop.
        for _ in range(3 * TTL_S * 4):
            await asyncio.sleep(0.25)
            entry = await etcd.get(name)
            assert entry is not None, "the worker's record left etcd"
            assert not superseded.is_set(), "the worker was stopped as superseded by its own registration"
        assert not keeper.superseded
        # It still writes its record (the draining one too) and its stop still removes it.
        await keeper.publish(record(ready=False))
        entry = await etcd.get(name)
        assert entry is not None and decode_worker(entry.value).ready is False
    finally:
        await keeper.stop()
    assert await etcd.get(name) is None, "the stop left the record in etcd"
