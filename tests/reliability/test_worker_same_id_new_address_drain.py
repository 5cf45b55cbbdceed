"""A worker id started again on a new address while its old process drains (issue 32).

The gateway used to close the old address's Work stream as soon as the id's record named the new address: the
requests in flight there were cancelled and done again elsewhere (nothing lost, but the old process's drain was
wasted), and the draining process's record refreshes overwrote the new process's record. Now the new process takes
the record over, the old one writes it no more, and the gateway finishes the old address's requests there while new
ones go to the new address.
"""

from __future__ import annotations

import signal
import time

import grpc
import numpy as np

from local_cluster import gateway_model, wait_until
from reliability.slow_worker import MODEL, SLOW, WARM, Call, draining, encode_answers, in_flight_on, registered, vectors
from sie.v1 import inference_pb2_grpc

# The old process holds its request's last batch this long: past the new process's start on a busy machine.
HELD = {**SLOW, "SIE_MAX_BATCH_WAIT_MS": "20000", "SIE_DRAIN_TIMEOUT_S": "90"}


def test_the_old_process_finishes_its_requests_and_the_new_address_takes_new_ones(cluster) -> None:
    gateway = cluster.start_gateway(wait=False)
    old = cluster.start_worker("w1", **HELD)
    gateway.wait_serving()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1",), what="w1 warm")
        call = Call(stub)  # held by the old process for HELD's batch wait
        in_flight_on(old)
        old.process.send_signal(signal.SIGTERM)
        assert draining(cluster, "w1") is not None
        new = cluster.start_worker("w1", **WARM)  # same id, another port
        assert new.address != old.address
        wait_until(
            lambda: (record := registered(cluster).get("w1")) is not None and record.address == new.address,
            what="the new process's record",
        )
        # While the old process drains, its refreshes (every 200 ms) do not take the record back.
        watched_until = time.monotonic() + 2
        while time.monotonic() < watched_until and old.process.poll() is None:
            record = registered(cluster).get("w1")
            assert record is not None and record.address == new.address and record.ready, record
            time.sleep(0.1)
        answer = call.answer()
        assert old.process.wait(timeout=60) == 0
        assert "cancelling" not in old.log()
        assert encode_answers(new.metrics_url, MODEL, "OK") == 0, (
            "the old process's request was done again at the new address"
        )
        # New requests go to the new address.
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1",), what="w1 warm again")
        np.testing.assert_allclose(answer, vectors(stub), atol=1e-5)  # the old one's answer, as the new one gives
        assert encode_answers(new.metrics_url, MODEL, "OK") == 1
    record = registered(cluster).get("w1")
    assert record is not None and record.address == new.address  # the old process's revoke left it alone
