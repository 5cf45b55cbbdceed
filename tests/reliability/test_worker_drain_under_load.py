"""SIGTERM on the only worker while clients keep sending through the gateway (issue 32, drain).

Every request the worker accepted is answered with the right vectors; every other one is refused UNAVAILABLE
with a reason that says to retry (PROVISIONING: no worker is up; WORKERS_LOST: the one tried was draining) and
never CANCELLED, INTERNAL or a hang. The worker has a 1 s batch window (no adaptive batching), so requests are
in flight across the signal.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import numpy as np

from grpc_helpers import encode_request, error_info
from local_cluster import gateway_model, wait_until
from reliability.slow_worker import MODEL, timed_encode
from sie.v1 import inference_pb2_grpc
from sie_contract.tensors import from_tensor

CLIENTS = 6
TEXTS = [f"steady client sentence {n}" for n in range(CLIENTS)]
RETRY_LATER = {"PROVISIONING", "WORKERS_LOST"}


def test_sigterm_on_the_only_worker_under_load_answers_or_refuses_each_request(cluster) -> None:
    worker = cluster.start_worker(
        "w1", SIE_PRELOAD_MODELS=MODEL, SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="1000"
    )
    gateway = cluster.start_gateway()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1",), what="w1 warm")
        expected = [
            from_tensor(result.dense) for result in stub.Encode(encode_request(MODEL, TEXTS), timeout=60).results
        ]
        signalled: list[float] = []
        outcomes: list[tuple[float, float, object]] = []  # (sent, ended, vector or error)
        lock = threading.Lock()

        def client(index: int) -> None:
            refusals = 0
            while refusals < 3:  # a few after the worker is gone, then stop
                outcome = timed_encode(stub, index, TEXTS[index])
                refusals += isinstance(outcome[2], grpc.RpcError)
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(2.5)
        signalled.append(time.monotonic())
        worker.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a call hung"
        assert worker.process.wait(timeout=60) == 0

    across = 0
    for sent, ended, result in outcomes:
        if isinstance(result, grpc.RpcError):
            assert result.code() == grpc.StatusCode.UNAVAILABLE, (result.code(), result.details())
            assert error_info(result).reason in RETRY_LATER, result.details()
            assert ended > signalled[0]
            continue
        index, vector = result  # type: ignore[misc]
        np.testing.assert_allclose(vector, expected[index], atol=1e-5)
        across += sent < signalled[0] < ended
    assert across >= 1, "no request was in flight across the signal"
    assert "cancelling" not in worker.log()
