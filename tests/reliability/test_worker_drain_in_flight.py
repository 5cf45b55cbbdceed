"""A SIGTERMed worker finishes every request the gateway already started on it (issue 32, drain).

On SIGTERM a cluster worker publishes that it is draining (its etcd record says not ready: gateways route nothing
new to it, but keep its Work stream open), finishes what it accepted, and only then leaves the registry. Before,
it left the registry first: the gateway closed its Work stream on seeing the key go, which cancelled every request
in flight on it; the worker then "drained" an empty engine at once and the caller got UNAVAILABLE / WORKERS_LOST
(or, with a second worker, the work was done again there).

A slow worker (reliability/slow_worker.py) keeps a request of many items (several device batches) in flight when
the signal lands. Every answer is compared with the vectors the same model gave before the signal.
"""

from __future__ import annotations

import signal

import grpc
import numpy as np
import pytest

from grpc_helpers import encode_request, error_info
from local_cluster import gateway_model, wait_until
from reliability.slow_worker import MODEL, SLOW, Call, draining, in_flight_on, registered, slow_and_warm, vectors
from sie.v1 import inference_pb2_grpc


def test_sigterm_on_the_only_worker_finishes_the_request_in_flight(cluster) -> None:
    worker = cluster.start_worker("w1", **SLOW)
    gateway = cluster.start_gateway()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1",), what="w1 warm")
        expected = vectors(stub)
        call = Call(stub)
        in_flight_on(worker)
        worker.process.send_signal(signal.SIGTERM)
        # Draining: its record says not ready (the gateway routes nothing new to it) until it has finished.
        record = draining(cluster, "w1")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Encode(encode_request(MODEL, ["too late"]), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(refused.value).reason == "PROVISIONING"
        np.testing.assert_allclose(call.answer(), expected, atol=1e-5)
        assert call.worker == "w1"
        assert record is not None and record.worker_id == "w1"  # still registered while it drained
        assert worker.process.wait(timeout=60) == 0
    assert "w1" not in registered(cluster)
    log = worker.log()
    assert "drained: no requests in flight" in log
    assert "cancelling" not in log


def test_sigterm_on_one_of_two_workers_finishes_its_requests_and_the_other_takes_new_ones(cluster) -> None:
    with slow_and_warm(cluster) as two:
        # The first call goes to w1; the second to w2 (w1 has one outstanding).
        calls = [Call(two.stub)]
        in_flight_on(two.slow)
        calls.append(Call(two.stub))
        two.slow.process.send_signal(signal.SIGTERM)
        record = draining(cluster, "w1")
        # New requests while w1 drains: all answered, by w2.
        later = [Call(two.stub) for _ in range(3)]
        for call in [*calls, *later]:
            np.testing.assert_allclose(call.answer(), two.expected, atol=1e-5)
        assert calls[0].worker == "w1"  # finished where it started, not computed again elsewhere
        assert record is not None  # still registered while it drained
        assert [call.worker for call in later] == ["w2"] * 3
        assert two.slow.process.wait(timeout=60) == 0
    assert set(registered(cluster)) == {"w2"}


def test_a_drain_that_runs_out_of_time_sends_the_unfinished_request_to_the_other_worker(cluster) -> None:
    with slow_and_warm(cluster, slow={"SIE_DRAIN_TIMEOUT_S": "1"}) as two:
        call = Call(two.stub)
        in_flight_on(two.slow)
        two.slow.process.send_signal(signal.SIGTERM)
        # w1 gives up after its 1 s drain timeout (before its 4 s batch window ends); the gateway sends it on.
        np.testing.assert_allclose(call.answer(), two.expected, atol=1e-5)
        assert call.worker == "w2"
        assert two.slow.process.wait(timeout=60) == 0
    assert "drain deadline passed with 1 requests in flight" in two.slow.log()
