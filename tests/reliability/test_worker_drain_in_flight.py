"""A SIGTERMed worker finishes every request the gateway already started on it (issue 32, drain).

On SIGTERM a cluster worker publishes that it is draining (its etcd record says not ready: gateways route nothing
new to it, but keep its Work stream open), finishes what it accepted, and only then leaves the registry. Before,
it left the registry first: the gateway closed its Work stream on seeing the key go, which cancelled every request
in flight on it; the worker then "drained" an empty engine at once and the caller got UNAVAILABLE / WORKERS_LOST
(or, with a second worker, the work was done again there).

The slow worker holds the last, partial device batch of a request for BATCH_WAIT_S (no adaptive batching), so a
request of ITEMS items (several device batches) is surely in flight when the signal lands. Every answer is compared
with the vectors the same model gave before the signal.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import numpy as np
import pytest

from grpc_helpers import encode_request, error_info
from local_cluster import etcd_call, gateway_model, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.cluster.cluster_store import WORKERS, decode_worker
from sie_contract.tensors import from_tensor

MODEL = "test/tiny-mean"
ITEMS = 200  # more than one device batch (SIE_MAX_BATCH_REQUESTS 64): the request is computed in pieces
TEXTS = [f"drain sentence number {n} " + "word " * (n % 13) for n in range(ITEMS)]
BATCH_WAIT_S = 4.0
SLOW = {
    "SIE_PRELOAD_MODELS": MODEL,
    "SIE_ADAPTIVE_BATCHING": "false",
    "SIE_MAX_BATCH_WAIT_MS": str(int(BATCH_WAIT_S * 1000)),
}
WARM = {"SIE_PRELOAD_MODELS": MODEL}


class Call:
    """One Encode of TEXTS through the gateway on a thread of its own: its answer (and serving worker) or error."""

    def __init__(self, stub: inference_pb2_grpc.InferenceStub, texts: list[str] = TEXTS) -> None:
        self.response: inference_pb2.EncodeResponse | None = None
        self.worker = ""
        self.error: grpc.RpcError | None = None
        self._thread = threading.Thread(target=self._run, args=(stub, texts))
        self._thread.start()

    def _run(self, stub: inference_pb2_grpc.InferenceStub, texts: list[str]) -> None:
        try:
            self.response, call = stub.Encode.with_call(encode_request(MODEL, texts), timeout=60)
            self.worker = dict(call.trailing_metadata())["x-sie-worker"]
        except grpc.RpcError as error:
            self.error = error

    def answer(self) -> np.ndarray:
        self._thread.join(timeout=90)
        assert not self._thread.is_alive(), "the call did not end"
        assert self.error is None, (self.error.code(), self.error.details())
        assert self.response is not None
        return np.stack([from_tensor(result.dense) for result in self.response.results])


def vectors(stub: inference_pb2_grpc.InferenceStub, texts: list[str] = TEXTS) -> np.ndarray:
    response = stub.Encode(encode_request(MODEL, texts), timeout=60)
    return np.stack([from_tensor(result.dense) for result in response.results])


def in_flight_on(worker, minimum: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Wait until the worker has at least `minimum` requests in its engine (from its metrics)."""
    import urllib.request

    def busy() -> bool:
        with urllib.request.urlopen(f"{worker.metrics_url}/metrics", timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("sie_worker_requests_in_flight "):
                    return float(line.split()[1]) >= minimum
        return False

    wait_until(busy, timeout_s=30, what="a request in flight on the worker")


def registered(cluster) -> dict:  # type: ignore[no-untyped-def]
    async def read(etcd):  # type: ignore[no-untyped-def]
        entries, _ = await etcd.read_prefix(WORKERS)
        return {entry.name.removeprefix(WORKERS): decode_worker(entry.value) for entry in entries}

    return etcd_call(cluster.etcd_endpoint, cluster.prefix, read)


def draining(cluster, worker_id: str):  # type: ignore[no-untyped-def]
    """Wait until the worker's record says it is not ready, or is gone; the record then (None: gone)."""
    seen: list = []

    def not_ready() -> bool:
        record = registered(cluster).get(worker_id)
        seen[:] = [record]
        return record is None or not record.ready

    wait_until(not_ready, timeout_s=10, what=f"{worker_id} draining in etcd")
    return seen[0]


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
    slow = cluster.start_worker("w1", wait=False, **SLOW)
    other = cluster.start_worker("w2", wait=False, **WARM)
    slow.wait_serving()
    other.wait_serving()
    gateway = cluster.start_gateway()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1", "w2"), what="both warm")
        with grpc.insecure_channel(other.address) as direct:
            expected = vectors(inference_pb2_grpc.InferenceStub(direct))
        # Idle, warm and equal: the gateway picks w1 (ids break the tie), and the second call goes to w2.
        calls = [Call(stub)]
        in_flight_on(slow)
        calls.append(Call(stub))
        slow.process.send_signal(signal.SIGTERM)
        record = draining(cluster, "w1")
        # New requests while w1 drains: all answered, by w2.
        later = [Call(stub) for _ in range(3)]
        for call in [*calls, *later]:
            np.testing.assert_allclose(call.answer(), expected, atol=1e-5)
        assert calls[0].worker == "w1"  # finished where it started, not computed again elsewhere
        assert record is not None  # still registered while it drained
        assert [call.worker for call in later] == ["w2"] * 3
        assert slow.process.wait(timeout=60) == 0
    assert set(registered(cluster)) == {"w2"}


def test_a_drain_that_runs_out_of_time_sends_the_unfinished_request_to_the_other_worker(cluster) -> None:
    slow = cluster.start_worker("w1", wait=False, SIE_DRAIN_TIMEOUT_S="1", **SLOW)
    other = cluster.start_worker("w2", wait=False, **WARM)
    slow.wait_serving()
    other.wait_serving()
    gateway = cluster.start_gateway()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1", "w2"), what="both warm")
        with grpc.insecure_channel(other.address) as direct:
            expected = vectors(inference_pb2_grpc.InferenceStub(direct))
        call = Call(stub)
        in_flight_on(slow)
        slow.process.send_signal(signal.SIGTERM)
        # w1 gives up after its 1 s drain timeout (before its 4 s batch window ends); the gateway sends it on.
        np.testing.assert_allclose(call.answer(), expected, atol=1e-5)
        assert call.worker == "w2"
        assert slow.process.wait(timeout=60) == 0
    assert "drain deadline passed with 1 requests in flight" in slow.log()
