"""A worker that dies with requests in flight on it: they are answered by the other worker (issue 32, item 6).

The victim is a slow worker (reliability/slow_worker.py), so the gateway's request is surely on its Work stream
when it dies: kill -9 mid-request, and SIGKILL in the middle of a drain that SIGTERM started. The request, all of
its items, is answered by the other worker with the right vectors, and no caller sees an error (MODEL_LOADING
included: the dead worker's record still says the model is loaded until its lease runs out).
"""

from __future__ import annotations

import signal

import numpy as np

from reliability.slow_worker import Call, TwoWorkers, draining, in_flight_on, registered, slow_and_warm

# Longer than the test: the killed worker's record stays in etcd (saying the model is loaded) throughout.
LONG_LEASE = {"SIE_WORKER_LEASE_TTL_S": "60"}
AFTERWARDS = 8


def answered_by_the_other(two: TwoWorkers, call: Call) -> None:
    """`call` and AFTERWARDS calls after it are answered by w2, with the right vectors."""
    np.testing.assert_allclose(call.answer(), two.expected, atol=1e-5)
    assert call.worker == "w2"
    later = [Call(two.stub) for _ in range(AFTERWARDS)]
    for later_call in later:
        np.testing.assert_allclose(later_call.answer(), two.expected, atol=1e-5)
    assert {later_call.worker for later_call in later} == {"w2"}


def test_kill_9_of_a_worker_with_a_request_in_flight_sends_it_to_the_other(cluster) -> None:
    with slow_and_warm(cluster, both=LONG_LEASE) as two:
        call = Call(two.stub)
        in_flight_on(two.slow)
        two.slow.kill()
        # The dead worker's record still says MODEL is loaded: nothing goes to it, nothing answers MODEL_LOADING.
        answered_by_the_other(two, call)
        assert "w1" in registered(cluster)


def test_sigkill_during_a_drain_sends_the_unfinished_request_to_the_other(cluster) -> None:
    with slow_and_warm(cluster, both=LONG_LEASE) as two:
        call = Call(two.stub)
        in_flight_on(two.slow)
        two.slow.process.send_signal(signal.SIGTERM)
        two.slow.process.send_signal(signal.SIGTERM)  # a second SIGTERM changes nothing: still draining
        record = draining(cluster, "w1")
        assert record is not None and not record.ready
        assert two.slow.exit_code() is None
        two.slow.kill()
        answered_by_the_other(two, call)
