"""The gateway's Work stream to a real worker: multiplexing, window, deadlines, a killed worker."""

from __future__ import annotations

import asyncio

import grpc
import numpy as np
import pytest

from sie.v1 import inference_pb2, types_pb2
from sie_contract.tensors import from_tensor
from sie_gateway.worker_link import WorkerLink, WorkerLost

MODEL = "test/tiny-mean"


def encode_request(texts: list[str]) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=text) for text in texts])


async def test_many_requests_multiplexed_on_one_stream(worker, stub) -> None:
    texts = [[f"link request {n} item {i}" for i in range(1 + n % 3)] for n in range(30)]
    expected = [np.stack([from_tensor(r.dense) for r in stub.Encode(encode_request(t)).results]) for t in texts]
    link = WorkerLink("w", worker.address, window=8)
    peak = 0

    async def one(batch: list[str]):
        nonlocal peak
        call = asyncio.ensure_future(link.call("encode", encode_request(batch), timeout_s=60))
        await asyncio.sleep(0)
        peak = max(peak, link.outstanding)
        return await call

    try:
        answers = await asyncio.gather(*(one(batch) for batch in texts))
    finally:
        await link.close()
    assert 1 < peak <= 8
    for answer, want in zip(answers, expected):
        assert answer.WhichOneof("outcome") == "encode"
        assert answer.worker_id  # every answer names the worker that served it
        np.testing.assert_allclose(np.stack([from_tensor(r.dense) for r in answer.encode.results]), want, atol=1e-5)


async def test_errors_come_back_as_statuses_on_the_stream(worker) -> None:
    link = WorkerLink("w", worker.address, window=4)
    try:
        answer = await link.call("encode", inference_pb2.EncodeRequest(model="no/such"), timeout_s=30)
        assert answer.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        answer = await link.call("score", inference_pb2.ScoreRequest(model=MODEL), timeout_s=30)
        assert answer.error.code in (grpc.StatusCode.UNIMPLEMENTED.value[0], grpc.StatusCode.INVALID_ARGUMENT.value[0])
        # The stream survived both.
        answer = await link.call("encode", encode_request(["still here"]), timeout_s=30)
        assert answer.WhichOneof("outcome") == "encode"
    finally:
        await link.close()


async def test_the_deadline_travels_with_the_request(start_worker) -> None:
    slow = start_worker(SIE_PRELOAD_MODELS=MODEL, SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="5000")  # a lone item waits 5 s for company
    link = WorkerLink("slow", slow.address, window=4)
    try:
        answer = await link.call("encode", encode_request(["alone"]), timeout_s=0.5)
    finally:
        await link.close()
    assert answer.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]


async def test_a_killed_worker_fails_its_requests_at_once(start_worker) -> None:
    doomed = start_worker(SIE_PRELOAD_MODELS=MODEL, SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="30000")  # requests sit in the batcher until the kill
    link = WorkerLink("doomed", doomed.address, window=16)
    calls = [asyncio.ensure_future(link.call("encode", encode_request([f"t{n}"]), timeout_s=120)) for n in range(5)]
    await asyncio.sleep(1.0)
    doomed.process.kill()
    try:
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 20)
    finally:
        await link.close()
    assert all(isinstance(result, WorkerLost) for result in results), results
    with pytest.raises(WorkerLost):
        await asyncio.wait_for(WorkerLink("doomed", doomed.address, window=1).call("encode", encode_request(["x"]), timeout_s=5), 20)
