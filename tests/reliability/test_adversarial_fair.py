"""Head-of-line blocking (issue 20, defect 12): a 4,096-item request must not hold a 1-item request behind all of
its batches, whether the small request is for another model or the same one.

The worker reports, per request with `debug`, the ids of the forward passes that carried its items (ids count
up in the order the device ran them), so the test asserts ordering, not time: the small request is answered
while the bulk one is still running, and most of the bulk's forward passes ran after the small one's."""

from __future__ import annotations

import time
import urllib.request

import grpc
import pytest
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

BULK_MODEL = "test/tiny-mean"
OTHER_MODEL = "test/tiny-cls"
BULK_ITEMS = 4096
# Items the bulk request must still have queued when the small request is sent: it is on the device, mid-way.
QUEUED_AT_LEAST = BULK_ITEMS // 2
BATCH_ITEMS = 64  # SIE_MAX_BATCH_REQUESTS's default: the bulk's short texts fill batches by count, not tokens
# Forward passes the small request may wait for: the one running, the one formed behind it, and slack for a
# bulk batch formed while the small request was still being tokenized.
WAITED_AT_MOST = 3


def queue_depth(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("sie_worker_queue_depth "):
                return float(line.split()[1])
    return 0.0


@pytest.fixture(scope="module")
def fair_worker(start_worker):
    return start_worker(SIE_PRELOAD_MODELS=f"{BULK_MODEL},{OTHER_MODEL}", SIE_INSTRUMENTATION="true")


@pytest.mark.parametrize("small_model", [OTHER_MODEL, BULK_MODEL], ids=["other model", "same model"])
def test_a_one_item_request_is_answered_amid_a_4096_item_one(fair_worker, small_model: str, reliability_report) -> None:
    bulk_request = inference_pb2.EncodeRequest(
        model=BULK_MODEL, items=[types_pb2.Item(text=f"bulk item {index} " + "word " * (5 + index % 20)) for index in range(BULK_ITEMS)], debug=True
    )
    small_request = inference_pb2.EncodeRequest(model=small_model, items=[types_pb2.Item(text="a short query")], debug=True)
    with grpc.insecure_channel(fair_worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        bulk = stub.Encode.future(bulk_request, timeout=300)
        deadline = time.monotonic() + 120
        while (queued := queue_depth(fair_worker.metrics_port)) < QUEUED_AT_LEAST:
            assert not bulk.done() and time.monotonic() < deadline, "the bulk request never queued half its items"
            time.sleep(0.005)
        small = stub.Encode(small_request, timeout=300)
        bulk_running_when_small_answered = not bulk.done()
        bulk_answer = bulk.result()

    assert len(small.results) == 1 and len(bulk_answer.results) == BULK_ITEMS
    [small_batch] = [stats.batch_id for stats in small.timing.batches]
    bulk_batches = [stats.batch_id for stats in bulk_answer.timing.batches]
    after_small = sum(batch_id > small_batch for batch_id in bulk_batches)
    # The bulk passes still to run when the small request was sent, less the few it may wait for.
    due_after = int(queued) // BATCH_ITEMS - WAITED_AT_MOST
    reliability_report.add(
        "head-of-line blocking",
        f"1-item request ({'same' if small_model == BULK_MODEL else 'other'} model) amid a {BULK_ITEMS}-item one",
        bulk_passes=len(bulk_batches),
        bulk_passes_queued_when_sent=int(queued) // BATCH_ITEMS,
        bulk_passes_after_small=after_small,
        small_answered_first=bulk_running_when_small_answered,
    )
    assert bulk_running_when_small_answered
    assert after_small >= due_after, (
        f"{after_small} of the bulk's {len(bulk_batches)} forward passes ran after the small request's;"
        f" {int(queued)} bulk items were queued when it was sent"
    )
