"""Adversarial pass on the worker's event loop: a small request must not hold it for other callers.

Requests of up to 8 items are tokenized on the event loop (Engine.off_loop). The tokenizer reads only a prefix of
a long text, unless the prefix shows no word to cut at: a text of long whitespace before its one word is read
whole, seconds for 8 such texts of 1.5 MiB. Held on the event loop, that work stalled every other caller; it must
go to the preprocessing threads. The test asserts ordering, not time: with debug, an answer names the forward
passes that ran its items (ids count up in the order they ran), so a one-item request sent while the heavy one
is tokenized runs first."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_helpers import encode_when_loaded
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

MODEL = "test/tiny-mean"
HEAVY_ITEMS = 8  # at most engine.INLINE_ITEMS: counted by items alone, they were tokenized on the event loop
HEAVY_TEXT = (
    " " * (3 * 2**19 - 4) + "word"
)  # 1.5 MiB; 8 of them stay under the 16 MiB message limit


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker(SIE_PRELOAD_MODELS=MODEL, SIE_INSTRUMENTATION="true")


def test_a_small_request_is_not_held_behind_eight_huge_texts_tokenized(
    worker, reliability_report
) -> None:
    heavy_request = inference_pb2.EncodeRequest(
        model=MODEL, items=[types_pb2.Item(text=HEAVY_TEXT)] * HEAVY_ITEMS, debug=True
    )
    small_request = inference_pb2.EncodeRequest(
        model=MODEL, items=[types_pb2.Item(text="a short query")], debug=True
    )
    with grpc.insecure_channel(
        worker.address, options=[("grpc.max_send_message_length", 16 * 2**20)]
    ) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        encode_when_loaded(stub, MODEL, ["warm up"])
        heavy = stub.Encode.future(heavy_request, timeout=300)
        time.sleep(
            1.0
        )  # let the heavy request reach the worker and its tokenization start (it takes seconds)
        started = time.monotonic()
        small = stub.Encode(small_request, timeout=300)
        small_s = time.monotonic() - started
        heavy_answer = heavy.result()

    assert len(small.results) == 1 and len(heavy_answer.results) == HEAVY_ITEMS
    [small_pass] = [stats.batch_id for stats in small.timing.batches]
    heavy_passes = sorted(stats.batch_id for stats in heavy_answer.timing.batches)
    reliability_report.add(
        "worker event loop",
        f"1-item request sent while {HEAVY_ITEMS} texts of 1.5 MiB (whitespace, then one word) are tokenized",
        small_answered_s=round(small_s, 2),
        heavy_tokenization_ms=round(heavy_answer.timing.tokenization_ms),
        small_pass=small_pass,
        heavy_passes=heavy_passes,
    )
    assert small_pass < heavy_passes[0], (
        f"the small request ran in pass {small_pass}, after the heavy one's {heavy_passes}: it waited for its tokenization"
    )
