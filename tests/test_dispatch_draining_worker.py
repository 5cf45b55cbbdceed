"""A worker that answers SHUTTING_DOWN is out of the dispatcher's routing at once (issue 32, drain).

A gateway that has not read the draining worker's record (`ready` false), say one cut off from etcd, still has it
as the best candidate. Its first request there is refused SHUTTING_DOWN and sent on to the other worker; from
then on requests go straight to the other worker, not each through a refusal first, for the whole drain.
"""

from __future__ import annotations

import signal
import threading

import grpc

from grpc_helpers import encode_request
from local_cluster import wait_until
from reliability.slow_worker import in_flight_on, unavailable_answers
from sie.v1 import inference_pb2_grpc
from sie_common.cluster.cluster_store import WorkerRecord
from sie_gateway.dispatch import Dispatcher

MODEL = "test/tiny-cls"


async def test_a_draining_worker_is_out_of_routing_after_its_first_refusal(start_worker) -> None:
    # Its batch window keeps a request in flight, so it stays draining while the dispatcher is tried.
    draining = start_worker(
        SIE_WORKER_ID="a-draining",
        SIE_PRELOAD_MODELS=MODEL,
        SIE_ADAPTIVE_BATCHING="false",
        SIE_MAX_BATCH_WAIT_MS="8000",
    )
    other = start_worker(SIE_WORKER_ID="b-other", SIE_PRELOAD_MODELS=MODEL)
    held: dict[str, object] = {}

    def hold() -> None:
        with grpc.insecure_channel(draining.address) as channel:
            held["answer"] = inference_pb2_grpc.InferenceStub(channel).Encode(
                encode_request(MODEL, ["held"]), timeout=60
            )

    holder = threading.Thread(target=hold)
    holder.start()
    warm = frozenset({MODEL})
    # Both warm and idle: "a-draining" sorts first, so it is the dispatcher's first choice.
    records = [
        WorkerRecord("a-draining", draining.address, "default", "cpu", loaded_models=warm),
        WorkerRecord("b-other", other.address, "default", "cpu", loaded_models=warm),
    ]
    dispatcher = Dispatcher(window=8)

    def candidates(tried):  # type: ignore[no-untyped-def]
        return [record for record in records if record.worker_id not in tried]

    try:
        in_flight_on(draining)
        draining.process.send_signal(signal.SIGTERM)
        wait_until(lambda: "stopping: draining" in draining.log(), what="the worker draining")
        served = []
        for n in range(6):
            answer = await dispatcher.dispatch(
                "encode", encode_request(MODEL, [f"during {n}"]), model=MODEL, candidates=candidates, deadline=None
            )
            assert answer.WhichOneof("outcome") == "encode" and len(answer.encode.results) == 1
            served.append(answer.worker_id)
        assert served == ["b-other"] * 6
        assert dispatcher.lost == {"a-draining"}
        # One refusal, the first (it was the first choice): the five after it went straight to the other worker.
        assert unavailable_answers(draining.metrics_url, MODEL) == 1
    finally:
        await dispatcher.close()
        holder.join(timeout=60)
    assert len(held["answer"].results) == 1  # type: ignore[attr-defined]  # its own request: drained, answered
    assert draining.process.wait(timeout=60) == 0
