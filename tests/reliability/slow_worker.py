"""A cluster worker that keeps requests in flight long enough to break it mid-request, and what tests of drain and
failover check with it: calls through the gateway on threads of their own, the worker's in-flight count, its record.

The slow worker holds the last, partial device batch of a request for BATCH_WAIT_S (no adaptive batching), so a
request of ITEMS items (several device batches, SIE_MAX_BATCH_REQUESTS being 64) is surely in flight when a
signal lands.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from grpc_helpers import encode_request
from local_cluster import etcd_call, gateway_model, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.cluster.cluster_store import WORKERS, WorkerRecord, decode_worker
from sie_contract.tensors import from_tensor
from worker_process import WorkerProcess

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


def timed_encode(stub: inference_pb2_grpc.InferenceStub, index: int, text: str) -> tuple[float, float, object]:
    """One Encode of `text`: when it was sent, when it ended, and (index, its vector) or the error."""
    sent = time.monotonic()
    try:
        response = stub.Encode(encode_request(MODEL, [text]), timeout=30)
        return sent, time.monotonic(), (index, from_tensor(response.results[0].dense))
    except grpc.RpcError as error:
        return sent, time.monotonic(), error


def vectors(stub: inference_pb2_grpc.InferenceStub, texts: list[str] = TEXTS) -> np.ndarray:
    """The vectors of `texts` as `stub` answers them now."""
    response = stub.Encode(encode_request(MODEL, texts), timeout=60)
    return np.stack([from_tensor(result.dense) for result in response.results])


def in_flight_on(worker, minimum: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Wait until the worker has at least `minimum` requests in its engine (from its metrics)."""

    def busy() -> bool:
        with urllib.request.urlopen(f"{worker.metrics_url}/metrics", timeout=10) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("sie_worker_requests_in_flight "):
                    return float(line.split()[1]) >= minimum
        return False

    wait_until(busy, timeout_s=30, what="a request in flight on the worker")


def unavailable_answers(metrics_url: str, model: str) -> float:
    """How many encode requests of `model` a worker answered UNAVAILABLE (from its metrics)."""
    return encode_answers(metrics_url, model, "UNAVAILABLE")


def encode_answers(metrics_url: str, model: str, status: str) -> float:
    """How many encode requests of `model` a worker answered with `status` (from its metrics)."""
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as reply:
        families = text_string_to_metric_families(reply.read().decode())
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == "sie_worker_requests_total"
        and sample.labels == {"model": model, "operation": "encode", "status": status}
    )


def registered(cluster) -> dict[str, WorkerRecord]:  # type: ignore[no-untyped-def]
    """Every worker record in etcd, by worker id."""

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


@dataclass
class TwoWorkers:
    slow: WorkerProcess  # w1: of two idle warm workers, the gateway picks it (ids break the tie)
    warm: WorkerProcess  # w2
    stub: inference_pb2_grpc.InferenceStub  # through the gateway
    expected: np.ndarray  # the vectors of TEXTS, from w2


@contextmanager
def slow_and_warm(cluster, slow: Mapping[str, str] = {}, both: Mapping[str, str] = {}) -> Iterator[TwoWorkers]:  # type: ignore[no-untyped-def]
    """A slow w1 (with `slow`'s settings too) and a warm w2 (`both` for both), both with MODEL loaded, and a
    gateway that routes to both."""
    first = cluster.start_worker("w1", wait=False, **{**SLOW, **both, **slow})
    second = cluster.start_worker("w2", wait=False, **{**WARM, **both})
    first.wait_serving()
    second.wait_serving()
    gateway = cluster.start_gateway()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == ("w1", "w2"), what="both warm")
        with grpc.insecure_channel(second.address) as direct:
            expected = vectors(inference_pb2_grpc.InferenceStub(direct))
        yield TwoWorkers(first, second, stub, expected)
