"""Dispatch over real workers: affinity, failover when a worker is killed mid-flight or refuses while draining."""

from __future__ import annotations

import asyncio
import signal
import time

import numpy as np
import pytest

from sie.v1 import inference_pb2, types_pb2
from sie_contract.tensors import from_tensor
from sie_gateway.dispatch import Dispatcher, NoWorker
from sie_common.cluster.cluster_store import WorkerRecord

MODEL = "test/tiny-cls"


def state(worker_id: str, worker, loaded: bool) -> WorkerRecord:
    return WorkerRecord(worker_id, worker.address, "default", "cpu", loaded_models=frozenset({MODEL} if loaded else ()))


def request(n: int) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=f"failover item {n}")])


async def test_requests_fail_over_when_their_worker_is_killed(start_worker, stub) -> None:
    victim = start_worker(SIE_PRELOAD_MODELS=MODEL, SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="30000")  # holds requests until it dies
    survivor = start_worker(SIE_PRELOAD_MODELS=MODEL)
    workers = [state("victim", victim, loaded=True), state("survivor", survivor, loaded=False)]
    expected = {n: from_tensor(stub.Encode(request(n)).results[0].dense) for n in range(12)}
    dispatcher = Dispatcher(window=64)

    def candidates(tried):
        return [w for w in workers if w.worker_id not in tried]

    calls = {n: asyncio.ensure_future(dispatcher.dispatch("encode", request(n), model=MODEL, candidates=candidates, deadline=None)) for n in expected}
    await asyncio.sleep(1.5)
    assert dispatcher.outstanding()["victim"] == len(expected)  # affinity: all went to the warm worker
    victim.process.kill()
    answers = await asyncio.wait_for(asyncio.gather(*calls.values()), 60)
    await dispatcher.close()

    for n, answer in zip(calls, answers):
        assert answer.worker_id == survivor_id(survivor)
        np.testing.assert_allclose(from_tensor(answer.encode.results[0].dense), expected[n], atol=1e-5)


async def test_a_draining_workers_refusal_is_sent_to_another_worker(start_worker, worker) -> None:
    # A long batch window keeps the first request in flight, so the worker drains instead of exiting.
    draining = start_worker(
        SIE_PRELOAD_MODELS=MODEL, SIE_MODEL_FILTER=MODEL, SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="5000"
    )
    survivor = worker  # the session's shared worker
    workers = [state("draining", draining, loaded=True), state("survivor", survivor, loaded=False)]
    dispatcher = Dispatcher(window=64)

    def candidates(tried):
        return [w for w in workers if w.worker_id not in tried]

    held = asyncio.ensure_future(dispatcher.dispatch("encode", request(0), model=MODEL, candidates=candidates, deadline=None))
    await _until(lambda: dispatcher.outstanding().get("draining") == 1, "the first request to be in flight on the draining worker")
    draining.process.send_signal(signal.SIGTERM)
    await _until(lambda: "stopping: draining" in draining.log(), "the worker to start draining")
    # The gateway still lists the draining worker (warm: chosen first); its SHUTTING_DOWN is not the caller's answer.
    answer = await asyncio.wait_for(dispatcher.dispatch("encode", request(1), model=MODEL, candidates=candidates, deadline=None), 60)
    drained = await asyncio.wait_for(held, 60)
    await dispatcher.close()
    assert answer.WhichOneof("outcome") == "encode" and answer.worker_id == survivor_id(survivor)
    assert drained.WhichOneof("outcome") == "encode" and drained.worker_id == survivor_id(draining)


async def _until(condition, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def survivor_id(worker) -> str:
    import socket

    return f"{socket.gethostname()}:{worker.port}"


async def test_no_eligible_worker_raises() -> None:
    dispatcher = Dispatcher(window=4)
    with pytest.raises(NoWorker) as raised:
        await dispatcher.dispatch("encode", request(0), model=MODEL, candidates=lambda tried: [], deadline=None)
    assert raised.value.tried == ()
