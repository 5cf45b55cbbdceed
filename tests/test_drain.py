"""SIGTERM under load: requests already accepted finish with correct answers,
new ones are refused with UNAVAILABLE (reason SHUTTING_DOWN), none is lost."""

from __future__ import annotations

import signal
import threading
import time

import grpc
import numpy as np
import pytest

from grpc_helpers import encode_request, error_info
from sie.v1 import inference_pb2_grpc
from sie_contract.tensors import from_tensor

MODEL = "test/tiny-mean"
# Its own batch key, so its batch window is its own: a request for it surely
# stays in flight for the whole window.
SLOW_MODEL = "test/tiny-cls"
CLIENTS = 6
WINDOW_S = 5.0


def test_sigterm_drains_in_flight_requests(start_worker) -> None:
    # A long batch window keeps requests in flight when the signal lands.
    worker = start_worker(
        SIE_PRELOAD_MODELS=f"{MODEL},{SLOW_MODEL}",
        SIE_MODEL_FILTER=f"{MODEL},{SLOW_MODEL}",
        SIE_ADAPTIVE_BATCHING="false",
        SIE_MAX_BATCH_WAIT_MS=str(int(WINDOW_S * 1000)),
    )
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

        slow: dict[str, object] = {}
        threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
        threads.append(threading.Thread(target=lambda: slow.setdefault("answer", stub.Encode(encode_request(SLOW_MODEL, ["slow"]), timeout=60))))
        for thread in threads:
            thread.start()
        time.sleep(WINDOW_S * 0.3)
        sigterm_at.append(time.monotonic())
        worker.process.send_signal(signal.SIGTERM)
        time.sleep(WINDOW_S * 0.1)
        # The slow request is still in flight, so the worker is draining, not gone: a new request is refused.
        with pytest.raises(grpc.RpcError) as refused:
            stub.Encode(encode_request(SLOW_MODEL, ["too late"]), timeout=60)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(refused.value).reason == "SHUTTING_DOWN"
        assert "shutting down" in refused.value.details()
        for thread in threads:
            thread.join(timeout=120)
        assert worker.process.wait(timeout=60) == 0
        assert len(slow["answer"].results) == 1  # accepted before the signal, answered after it

    drained = 0
    for sent, answered, result in outcomes:
        if isinstance(result, grpc.RpcError):
            # Refused, never accepted: the worker's SHUTTING_DOWN, or no server left to connect to.
            # A call sent after the signal may also reach the server in the instant it closes,
            # before any handler takes it; grpc core then cancels it (CANCELLED). One sent
            # before the signal was admitted, so it must have been answered.
            refusals = {grpc.StatusCode.UNAVAILABLE}
            if sent > sigterm_at[0]:
                refusals.add(grpc.StatusCode.CANCELLED)
            assert result.code() in refusals, (sent - sigterm_at[0], result)
            if result.trailing_metadata() and "grpc-status-details-bin" in dict(result.trailing_metadata()):
                assert error_info(result).reason == "SHUTTING_DOWN"
            continue
        index, vector = result
        np.testing.assert_allclose(vector, expected[index], atol=1e-5)
        if sent < sigterm_at[0] < answered:
            drained += 1
    assert drained >= 1, "no request was in flight across the signal"
    log = worker.log()
    assert "drained: no requests in flight" in log
