"""A worker whose Work stream broke is out of routing at once, and back once its health check says SERVING.

The preferred (warm) worker is reached through a relay the test cuts and
restores, so the same live process loses its stream and gets it back, with no
lease or registration change: only the dispatcher's own view moves.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from sie.v1 import inference_pb2, types_pb2
from sie_common.cluster.cluster_store import WorkerRecord
from sie_gateway.dispatch import Dispatcher, NoWorker

from reliability.link_cutter import LinkCutter

MODEL = "test/tiny-cls"


def request(n: int) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=f"lost worker item {n}")])


async def _until(condition, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_worker_whose_stream_broke_is_skipped_until_it_serves_again(worker, start_worker) -> None:
    other = start_worker(SIE_PRELOAD_MODELS=MODEL)
    relay = LinkCutter(worker.address)
    warm = WorkerRecord("warm", relay.address, "default", "cpu", loaded_models=frozenset({MODEL}))
    cold = WorkerRecord("cold", other.address, "default", "cpu")
    dispatcher = Dispatcher(window=8)

    def candidates(tried):
        return [record for record in (warm, cold) if record.worker_id not in tried]

    async def served_by(n: int) -> str:
        answer = await dispatcher.dispatch("encode", request(n), model=MODEL, candidates=candidates, deadline=None)
        assert answer.WhichOneof("outcome") == "encode" and len(answer.encode.results) == 1
        return answer.worker_id

    try:
        warm_id = await served_by(0)  # affinity: the warm worker, through the relay
        relay.cut()
        # The stream breaks under the next request: it is served by the other worker, and the warm one is out.
        cold_id = await served_by(1)
        assert cold_id != warm_id and dispatcher.lost == {"warm"}
        # While out it is not tried (no request pays a refused connection first), though its record says warm.
        assert {await served_by(n) for n in range(2, 7)} == {cold_id}
        relay.restore()
        await _until(lambda: not dispatcher.lost, "the warm worker's health check to answer SERVING")
        assert await served_by(7) == warm_id
    finally:
        await dispatcher.close()
        relay.close()


async def test_when_every_eligible_worker_is_lost_they_are_tried_anyway(worker) -> None:
    relay = LinkCutter(worker.address)
    only = WorkerRecord("only", relay.address, "default", "cpu", loaded_models=frozenset({MODEL}))
    dispatcher = Dispatcher(window=8)

    def candidates(tried):
        return [only] if "only" not in tried else []

    try:
        relay.cut()
        for n in range(2):
            with pytest.raises(NoWorker) as raised:
                await dispatcher.dispatch("encode", request(n), model=MODEL, candidates=candidates, deadline=None)
            # Tried each time (the caller hears WORKERS_LOST, not PROVISIONING as if no worker existed).
            assert raised.value.tried == ("only",) and dispatcher.lost == {"only"}
        relay.restore()
        await _until(lambda: not dispatcher.lost, "its health check to answer SERVING")
        answer = await dispatcher.dispatch("encode", request(2), model=MODEL, candidates=candidates, deadline=None)
        assert answer.WhichOneof("outcome") == "encode"
    finally:
        await dispatcher.close()
        relay.close()
