"""Drains that do not go to plan (issue 32): a worker SIGKILLed mid-drain, and every worker drained at once.

- SIGKILL right after a worker published that it drains: its `ready: false` record must not outlive its lease
  (nobody renews it any more), and the request that was in flight there is answered by the other worker.
- Both workers SIGTERMed together, each with a request in flight: each finishes its own (where it started, not
  elsewhere), new requests get a retryable UNAVAILABLE (PROVISIONING; never INTERNAL, never a hang), and etcd is
  left with no worker record.
"""

from __future__ import annotations

import signal
import time

import grpc
import numpy as np

from grpc_helpers import encode_request, error_info
from local_cluster import wait_until
from reliability.slow_worker import MODEL, SLOW, Call, draining, in_flight_on, registered, slow_and_warm

LEASE_TTL_S = 3  # the cluster fixture's SIE_WORKER_LEASE_TTL_S


def test_a_worker_killed_mid_drain_leaves_no_record_beyond_its_lease_and_its_request_fails_over(cluster) -> None:
    with slow_and_warm(cluster) as two:
        call = Call(two.stub)
        in_flight_on(two.slow)
        two.slow.process.send_signal(signal.SIGTERM)
        record = draining(cluster, "w1")
        assert record is not None and not record.ready
        two.slow.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        np.testing.assert_allclose(call.answer(), two.expected, atol=1e-5)
        assert call.worker == "w2"
        wait_until(lambda: "w1" not in registered(cluster), timeout_s=LEASE_TTL_S + 10, what="w1's record gone")
        assert time.monotonic() - killed < LEASE_TTL_S + 5
        assert set(registered(cluster)) == {"w2"}


def test_every_worker_drained_at_once_finishes_its_own_and_refuses_new_work_retryably(cluster) -> None:
    with slow_and_warm(cluster, both=SLOW) as two:  # both slow
        calls = [Call(two.stub) for _ in range(2)]  # one on each (least outstanding)
        for worker in (two.slow, two.warm):
            in_flight_on(worker)
        for worker in (two.slow, two.warm):
            worker.process.send_signal(signal.SIGTERM)
        draining(cluster, "w1")
        draining(cluster, "w2")
        refusals = []
        for _ in range(5):
            try:
                two.stub.Encode(encode_request(MODEL, ["while both drain"]), timeout=30)
                refusals.append("answered")
            except grpc.RpcError as error:
                refusals.append(f"{error.code().name} {error_info(error).reason}")
        # PROVISIONING once the gateway has read both records; WORKERS_LOST if it had not yet and both refused it
        # SHUTTING_DOWN: retryable either way.
        assert set(refusals) <= {"UNAVAILABLE PROVISIONING", "UNAVAILABLE WORKERS_LOST"}, refusals
        for call in calls:
            np.testing.assert_allclose(call.answer(), two.expected, atol=1e-5)
        assert sorted(call.worker for call in calls) == ["w1", "w2"]
        assert two.slow.process.wait(timeout=60) == 0
        assert two.warm.process.wait(timeout=60) == 0
    assert registered(cluster) == {}
