"""EncodeStream bounds (issue 32, defect 8): answers are tagged unambiguously, and the number of open streams is
bounded per process, on the worker and on the gateway.

Before: an explicit request_id "1" and a later request without one (tagged by its position, "1") gave two answers
tagged "1"; callers that never read were bounded per stream (162 MB for one) but nothing bounded how many such
streams one process served. And callers that write requests as fast as they can and never read (HTTP/2 flow
control holds them back)."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc

from grpc_helpers import error_info
from local_cluster import wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.edge.errors import status_reason

COLBERT = "test/tiny-colbert"
MEAN = "test/tiny-mean"
# Growth of a worker's resident memory allowed while its streams are full of unread answers.
RSS_BOUND_MB = 150
REFUSED_STREAMS = 20


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def stream_request(request_id: str, model: str = MEAN, text: str = "x", items: int = 1) -> inference_pb2.EncodeStreamRequest:
    return inference_pb2.EncodeStreamRequest(
        request=inference_pb2.EncodeRequest(model=model, request_id=request_id, items=[types_pb2.Item(text=text)] * items)
    )


def test_an_explicit_id_and_a_position_never_tag_two_answers_alike(stub) -> None:
    answers = list(stub.EncodeStream(iter([stream_request("1"), stream_request(""), stream_request("2"), stream_request("")]), timeout=60))
    tags = sorted(answer.request_id for answer in answers)
    assert tags == ["", "", "1", "2"]
    refusals = [answer.error for answer in answers if answer.request_id == ""]
    assert all(status_reason(error) == "MIXED_REQUEST_IDS" and error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] for error in refusals)
    assert sorted(error.message.split("position ")[1][:1] for error in refusals) == ["1", "3"]
    assert all(answer.WhichOneof("outcome") == "response" for answer in answers if answer.request_id)

    # A stream without ids keeps its positions; an explicit id on it is refused, never tagged like a position.
    answers = list(stub.EncodeStream(iter([stream_request(""), stream_request("0"), stream_request("")]), timeout=60))
    assert sorted(answer.request_id for answer in answers) == ["", "0", "2"]
    (refusal,) = [answer.error for answer in answers if answer.request_id == ""]
    assert status_reason(refusal) == "MIXED_REQUEST_IDS" and "request_id '0' (position 1)" in refusal.message
    assert all(answer.WhichOneof("outcome") == "response" for answer in answers if answer.request_id)


def known(stub: inference_pb2_grpc.InferenceStub) -> int:
    """A known request's answer: its item count."""
    request = inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="a known request")])
    return len(stub.Encode(request, timeout=30).results)


def _encoded_ok(metrics_url: str, model: str) -> float:
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(f'sie_worker_requests_total{{model="{model}",operation="encode",status="OK"}}'):
                return float(line.split()[-1])
    return 0.0


def _refusal(call: Iterator[inference_pb2.EncodeStreamResponse]) -> tuple[grpc.StatusCode, str]:
    try:
        next(call)
    except grpc.RpcError as error:
        return error.code(), error_info(error).reason
    return grpc.StatusCode.OK, ""


def test_streams_past_the_limit_are_refused_and_unread_ones_stay_bounded(start_worker, reliability_report) -> None:
    worker = start_worker(SIE_PRELOAD_MODELS=COLBERT, SIE_MAX_ENCODE_STREAMS="3", SIE_ENCODE_STREAM_WINDOW="8")
    text = " ".join(f"word{n}" for n in range(120))
    big = stream_request("", COLBERT, text, items=100)  # each answer: ~800 KB of multivectors
    big.request.output_types.append("multivector")
    release = threading.Event()

    def requests() -> Iterator[inference_pb2.EncodeStreamRequest]:
        for index in range(12):
            request = inference_pb2.EncodeStreamRequest()
            request.CopyFrom(big)
            request.request.request_id = str(index)
            yield request
        release.wait(120)

    # A caller that never reads: its flow-control window stays at 64 KiB (gRPC's BDP probe would otherwise grow it to
    # megabytes on a fast machine, and the client library would take in every answer the server writes).
    unread = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 65536)]
    with grpc.insecure_channel(worker.address, options=unread) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert stub.Encode(big.request, timeout=60).results
        pid = worker.process.pid
        baseline = rss_mb(pid)
        held = [stub.EncodeStream(requests(), timeout=300) for _ in range(3)]  # their answers are never read
        wait_until(lambda: _encoded_ok(worker.metrics_url, COLBERT) >= 1 + 3 * 8, timeout_s=240, what="three full windows")
        refused = [_refusal(stub.EncodeStream(requests(), timeout=60)) for _ in range(REFUSED_STREAMS)]
        time.sleep(1)
        peak = rss_mb(pid)
        answered = _encoded_ok(worker.metrics_url, COLBERT)
        release.set()
        for call in held:
            call.cancel()
        # A closed stream frees its place.
        wait_until(lambda: _refusal(stub.EncodeStream(iter([stream_request("a", COLBERT)]), timeout=60))[0] == grpc.StatusCode.OK, timeout_s=30, what="a free place")
    reliability_report.add(
        "encode stream",
        "3 streams never read (limit 3, window 8) and 20 more opened",
        answered=int(answered),
        rss_growth_mb=round(peak - baseline),
        bound_mb=RSS_BOUND_MB,
    )
    assert refused == [(grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")] * REFUSED_STREAMS
    assert answered <= 1 + 3 * (8 + 2)  # the held streams' windows (and an answer each being written), nothing more
    assert peak - baseline < RSS_BOUND_MB


def test_the_gateway_bounds_its_streams_too(cluster) -> None:
    cluster.start_worker("stream-worker", SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(SIE_MAX_ENCODE_STREAMS="2")
    release = threading.Event()

    def idle() -> Iterator[inference_pb2.EncodeStreamRequest]:
        release.wait(60)
        yield from ()

    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: _refusal(stub.EncodeStream(iter([stream_request("w")]), timeout=30))[0] == grpc.StatusCode.OK, timeout_s=60, what="the worker behind the gateway")
        held = [stub.EncodeStream(idle(), timeout=120) for _ in range(2)]
        time.sleep(0.5)
        with_limit = _refusal(stub.EncodeStream(iter([stream_request("x")]), timeout=30))
        held[0].cancel()
        wait_until(lambda: _refusal(stub.EncodeStream(iter([stream_request("y")]), timeout=30))[0] == grpc.StatusCode.OK, timeout_s=30, what="a free place")
        release.set()
        held[1].cancel()
    assert with_limit == (grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_STREAMS")


# --- EncodeStream callers that never read, straight to a worker ----------------------------------------------

HOG_STREAMS = 40
HOG_SECONDS = 20
HOG_TEXT = "word " * 6500  # ~32 KB: the tokenizer reads a prefix, the transport carries it all
# Growth of the worker's resident memory allowed while the callers write: with grpc's BDP probe on (before the
# fix), HTTP/2 receive windows widened until 0.7-2.6 GB of unread requests sat in the worker.
HOG_RSS_BOUND_MB = 300


def test_encode_stream_callers_that_never_read_do_not_grow_the_worker(start_worker, reliability_report) -> None:
    """40 EncodeStream callers each write 32 KB requests as fast as the transport takes them and read nothing
    back: HTTP/2 flow control (fixed windows, no BDP probe) holds the writers back, so the worker's memory stays
    bounded and it keeps answering others."""
    worker = start_worker(SIE_PRELOAD_MODELS=MEAN)
    with grpc.insecure_channel(worker.address) as channel:
        assert known(inference_pb2_grpc.InferenceStub(channel)) == 1
    baseline = rss_mb(worker.pid)
    request = inference_pb2.EncodeStreamRequest(request=inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text=HOG_TEXT)]))
    sent = 0

    async def hog() -> float:
        nonlocal sent
        peak = baseline
        async with grpc.aio.insecure_channel(worker.address) as aio_channel:
            stub = inference_pb2_grpc.InferenceStub(aio_channel)
            calls = [stub.EncodeStream() for _ in range(HOG_STREAMS)]

            async def write(call) -> None:  # type: ignore[no-untyped-def]
                nonlocal sent
                while True:
                    await call.write(request)
                    sent += 1

            writers = [asyncio.create_task(write(call)) for call in calls]
            deadline = time.monotonic() + HOG_SECONDS
            while time.monotonic() < deadline:
                peak = max(peak, rss_mb(worker.pid))
                await asyncio.sleep(0.25)
            for writer in writers:
                writer.cancel()
            for call in calls:
                call.cancel()
            await asyncio.gather(*writers, return_exceptions=True)
        return peak

    peak = asyncio.run(hog())
    # The cancelled streams' requests (up to 40 x SIE_ENCODE_STREAM_WINDOW) may still fill the worker's admission
    # for a moment: it answers QUEUE_FULL until they finish, then serves again.
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        deadline = time.monotonic() + 60
        while True:
            try:
                assert known(stub) == 1
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline, error
                time.sleep(0.5)
    reliability_report.add(
        "adversarial attack",
        f"{HOG_STREAMS} EncodeStream callers writing 32 KB requests for {HOG_SECONDS} s, never reading",
        requests_written=sent,
        rss_growth_mb=round(peak - baseline),
        bound_mb=HOG_RSS_BOUND_MB,
    )
    assert sent > HOG_STREAMS  # the callers did get requests through
    assert peak - baseline < HOG_RSS_BOUND_MB
