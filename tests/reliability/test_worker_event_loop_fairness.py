"""Adversarial pass on the worker's event loop: a small request must not hold it for other callers.

A request's CPU work goes to the preprocessing threads unless it is a few items of short text
(Preparation.off_loop). Eight texts of 1.5 MiB of whitespace before one word once took seconds to tokenize on
the event loop; a text is no longer read whole (tests/test_text_tokenizer_long_words.py), so that request no
longer holds anyone. What is left here: a caller that goes away mid-way leaves nothing queued."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import grpc
import pytest

from grpc_helpers import encode_when_loaded
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_worker.batching.former import BatchFormer, BatchLimits, PendingItem

MODEL = "test/tiny-mean"
BULK_ITEMS = 4096


@pytest.fixture(scope="module")
def instrumented_worker(start_module_worker):
    return start_module_worker(SIE_PRELOAD_MODELS=MODEL, SIE_INSTRUMENTATION="true")


def queue_depth(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith("sie_worker_queue_depth "):
                return float(line.split()[1])
    raise AssertionError("the worker exports no sie_worker_queue_depth")


def test_a_request_cancelled_while_queued_leaves_no_items_in_the_queue_depth(
    instrumented_worker, reliability_report
) -> None:
    """A caller that goes away mid-way through a bulk request: its queued items leave the batch former, and the
    queue depth the worker exports (what an autoscaler reads) says so, with nothing else arriving to refresh it."""
    bulk_request = inference_pb2.EncodeRequest(
        model=MODEL,
        items=[types_pb2.Item(text=f"bulk item {index} " + "word " * 20) for index in range(BULK_ITEMS)],
    )
    with grpc.insecure_channel(instrumented_worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        encode_when_loaded(stub, MODEL, ["warm up"])
        bulk = stub.Encode.future(bulk_request, timeout=300)
        deadline = time.monotonic() + 120
        while (queued := queue_depth(instrumented_worker.metrics_port)) < BULK_ITEMS // 2:
            assert not bulk.done() and time.monotonic() < deadline, "the bulk request never queued half its items"
            time.sleep(0.005)
        bulk.cancel()
        settle = time.monotonic() + 10
        while (left := queue_depth(instrumented_worker.metrics_port)) and time.monotonic() < settle:
            time.sleep(0.05)
        later = stub.Encode(
            inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text="still answered")]),
            timeout=60,
        )
    reliability_report.add(
        "worker event loop",
        f"{BULK_ITEMS}-item request cancelled with {int(queued)} items queued",
        queue_depth_after=int(left),
        later_request_answered=len(later.results) == 1,
    )
    assert bulk.cancelled()
    assert left == 0, f"the worker reports {left} items queued after their request was cancelled, with none waiting"
    assert len(later.results) == 1


async def test_a_batch_given_back_after_its_request_was_cancelled_is_not_queued_again() -> None:
    """The engine checks `may_displace`, then awaits the newer batch; a caller whose items sit in the staged batch
    may go away meanwhile (its queued items are discarded). Giving that batch back must not queue its items
    again: they would run a forward pass for nobody and count in the queue depth."""
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    loop = asyncio.get_running_loop()
    bulk = [PendingItem("bulk", 10, f"bulk{index}", loop.create_future()) for index in range(12)]
    former.add(bulk, limits)
    await asyncio.wait_for(former.next_batch(), 1)  # running
    staged = await asyncio.wait_for(former.next_batch(), 1)
    assert former.may_displace(staged)
    for item in bulk:  # the caller goes away: Engine._run_on_device cancels its futures and discards them
        item.future.cancel()
    former.discard(bulk)
    former.give_back(staged, limits)
    assert former.pending == 0
