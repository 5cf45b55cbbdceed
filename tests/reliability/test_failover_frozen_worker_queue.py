"""A frozen worker's requests that wait for a slot on its Work stream fail over, never UNKNOWN (issue 32).

The gateway keeps at most SIE_GATEWAY_WORKER_WINDOW requests in flight on one worker's stream; the rest wait for a
slot. A worker that freezes (SIGSTOP, a hung node, a partition) stops renewing its lease, so its record leaves etcd
after the lease TTL and the gateway closes its link. The requests in flight on the stream then failed over, but each
one still waiting for a slot took one once they left and opened a stream on the closed channel: grpc raised
UsageError("Channel is closed") and the caller got UNKNOWN instead of being sent elsewhere (12 of 40 requests in
the attack that found it, with a second worker up to take them).

Here one slow worker (reliability/slow_worker.py: each request several seconds) holds one request on a window of 1
while five more wait; it is frozen, its lease runs out, and every caller must get a retryable UNAVAILABLE (no worker
is left); once thawed it registers again and serves.
"""

from __future__ import annotations

import signal

import grpc

from grpc_helpers import encode_request, error_info
from local_cluster import gateway_model, wait_until
from reliability.slow_worker import MODEL, SLOW, TEXTS, in_flight_on, registered
from sie.v1 import inference_pb2_grpc

QUEUED = 5


def test_requests_queued_on_a_frozen_workers_window_fail_over_not_unknown(cluster) -> None:
    worker = cluster.start_worker("w1", **SLOW)
    gateway = cluster.start_gateway(SIE_GATEWAY_WORKER_WINDOW="1")
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1",), what="w1 warm")
        calls = [stub.Encode.future(encode_request(MODEL, TEXTS), timeout=60) for _ in range(1 + QUEUED)]
        in_flight_on(worker)
        worker.process.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: "w1" not in registered(cluster), timeout_s=20, what="the frozen worker's lease to end")
            outcomes = []
            for call in calls:
                try:
                    call.result(timeout=60)
                    outcomes.append("answered")
                except grpc.RpcError as error:
                    outcomes.append(f"{error.code().name} {error_info(error).reason}")
        finally:
            worker.process.send_signal(signal.SIGCONT)
        # The one in flight and the five waiting alike: tried on w1, which went away.
        assert outcomes == ["UNAVAILABLE WORKERS_LOST"] * (1 + QUEUED)
        # Thawed, it registers again (a new lease) and serves again through the same gateway.
        wait_until(lambda: "w1" in registered(cluster), timeout_s=20, what="w1 registered again")
        response, call = stub.Encode.with_call(encode_request(MODEL, ["after the thaw"]), timeout=60)
        assert len(response.results) == 1
        assert dict(call.trailing_metadata())["x-sie-worker"] == "w1"
