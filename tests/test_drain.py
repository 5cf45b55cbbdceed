"""SIGTERM under load: requests already accepted finish with correct answers,
new ones are refused with UNAVAILABLE (reason SHUTTING_DOWN), none is lost."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import numpy as np

from rpc import encode_request, error_info
from sie.v1 import inference_pb2_grpc
from sie_common.tensors import from_tensor

MODEL = "test/tiny-mean"
CLIENTS = 6


def test_sigterm_drains_in_flight_requests(start_worker) -> None:
    # A long batch window keeps requests in flight when the signal lands.
    worker = start_worker(SIE_PRELOAD_MODELS=MODEL, SIE_MODEL_FILTER=MODEL, SIE_MAX_BATCH_WAIT_MS="1500")
    texts = [f"request number {i}" for i in range(CLIENTS)]
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        expected = [from_tensor(result.dense) for result in stub.Encode(encode_request(MODEL, texts), timeout=60).results]

        sigterm_at: list[float] = []
        outcomes: list[tuple[float, float, object]] = []  # (sent, answered, vector or error)
        lock = threading.Lock()

        def client(index: int) -> None:
            while True:
                sent = time.monotonic()
                try:
                    response = stub.Encode(encode_request(MODEL, [texts[index]]), timeout=60)
                    result: object = (index, from_tensor(response.results[0].dense))
                except grpc.RpcError as error:
                    result = error
                with lock:
                    outcomes.append((sent, time.monotonic(), result))
                if isinstance(result, grpc.RpcError):
                    return

        threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
        for thread in threads:
            thread.start()
        time.sleep(2.5)
        sigterm_at.append(time.monotonic())
        worker.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=120)
        assert worker.process.wait(timeout=60) == 0

    drained = 0
    refused = 0
    for sent, answered, result in outcomes:
        if isinstance(result, grpc.RpcError):
            # Refused, never accepted: the worker's SHUTTING_DOWN, or no server left to connect to.
            assert result.code() == grpc.StatusCode.UNAVAILABLE, result
            if result.trailing_metadata() and "grpc-status-details-bin" in dict(result.trailing_metadata()):
                assert error_info(result).reason == "SHUTTING_DOWN"
                refused += 1
            continue
        index, vector = result
        np.testing.assert_allclose(vector, expected[index], atol=1e-5)
        if sent < sigterm_at[0] < answered:
            drained += 1
    assert drained >= 1, "no request was in flight across the signal"
    assert refused >= 1, "no request was refused while draining"
    log = worker.log()
    assert "drained: no requests in flight" in log
