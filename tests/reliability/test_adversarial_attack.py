"""Adversarial inputs the rest of the suite does not contain, found by attacking the issue-20 hardening
(issue 20): each case was a defect on main; it asserts the exact status and reason, and that the worker
still serves afterwards."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator

import grpc
import pytest
from PIL import Image

from grpc_helpers import error_details, error_info, stacked
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from worker_process import inference_stub

KNOWN_MODEL = "test/tiny-mean"
RERANKER = "test/tiny-reranker"
DEADLINE_S = 30


@pytest.fixture(scope="module")
def attacked(start_module_worker) -> Iterator:
    """A worker with one image thread: an image that holds it holds every image request.

    Killed at the end of the module: on code without the fixes, a case may leave it busy."""
    worker = start_module_worker(SIE_PRELOAD_MODELS=f"{KNOWN_MODEL},test/tiny-clip,{RERANKER}", SIE_IMAGE_WORKERS="1")
    yield worker
    worker.kill()


@pytest.fixture(scope="module")
def attacked_stub(attacked) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(attacked) as stub:
        yield stub


def known(stub) -> int:
    """A known request's answer: its item count."""
    request = inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(text="a known request")])
    return len(stub.Encode(request, timeout=DEADLINE_S).results)


def outcome(error: grpc.RpcError) -> str:
    info, _ = error_details(error)
    return f"{error.code().name} {info.reason}" if info is not None else error.code().name


def image_item(data: bytes) -> types_pb2.Item:
    return types_pb2.Item(images=[types_pb2.Image(data=data)])


# --- JPEG scan bomb -------------------------------------------------------------------------------------------


def progressive_jpeg(side: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("L", (side, side), 128).save(buffer, format="JPEG", progressive=True)
    return buffer.getvalue()


def scan_bomb(side: int, scans: int) -> bytes:
    """A progressive JPEG with `scans` more copies of its smallest scan before EOI: 12 bytes each, and libjpeg
    runs every one over the whole image (1024 x 1024 with 80,000 scans: about 9 s of CPU)."""
    data = progressive_jpeg(side)
    position, smallest = 2, None
    while data[position + 1] != 0xD9:
        end = position + 2 + int.from_bytes(data[position + 2 : position + 4], "big")
        if data[position + 1] == 0xDA:  # a scan: its entropy-coded data runs to the next marker
            while data[end] != 0xFF or data[end + 1] == 0x00 or 0xD0 <= data[end + 1] <= 0xD7:
                end += 1
            if smallest is None or end - position < len(smallest):
                smallest = data[position:end]
        position = end
    assert smallest is not None
    return data[:position] + smallest * scans + data[position:]


def test_a_jpeg_of_many_scans_is_refused_before_decoding(attacked, attacked_stub, reliability_report) -> None:
    """On main a 300 KB file of 25,000 empty scans held the image thread for seconds (10 MB of them: most of an
    hour at 6000 x 6000), and every image request waited behind it."""
    data = scan_bomb(1024, 25_000)
    assert len(data) < 400_000
    request = inference_pb2.EncodeRequest(model="test/tiny-clip", items=[image_item(data)])
    with pytest.raises(grpc.RpcError) as raised:
        attacked_stub.Encode(request, timeout=DEADLINE_S)
    error = raised.value
    reliability_report.add("adversarial attack", "JPEG of 25,000 scans", expected="INVALID_ARGUMENT IMAGE_TOO_MANY_SCANS", actual=outcome(error))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    info = error_info(error)
    assert info.reason == "IMAGE_TOO_MANY_SCANS"
    assert info.metadata["setting"] == "SIE_MAX_JPEG_SCANS" and info.metadata["limit"] == "100"
    # An ordinary progressive JPEG (10 scans) and a text request are still answered.
    answer = attacked_stub.Encode(inference_pb2.EncodeRequest(model="test/tiny-clip", items=[image_item(progressive_jpeg(64))]), timeout=DEADLINE_S)
    assert stacked([answer.results[0].dense]).shape[0] == 1
    assert known(attacked_stub) == 1


# --- texts tokenized whole before truncation -------------------------------------------------------------------

RSS_BOUND_BYTES = 256 * 2**20


def peak_rss(pid: int) -> int:
    """VmHWM of a process: the most resident memory it has had, in bytes."""
    for line in open(f"/proc/{pid}/status").read().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_long_texts_are_tokenized_only_as_far_as_the_model_reads(attacked, attacked_stub, reliability_report) -> None:
    """Three texts of 2 MiB of one-letter words, each under SIE_MAX_TEXT_BYTES: on main the tokenizer read all
    of them before truncating to the model's 128 tokens, adding about 1 GB to the worker (seven: 2 GB, 30 s)."""
    text = "a " * 2**20
    before = peak_rss(attacked.process.pid)
    request = inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(id=str(index), text=text) for index in range(3)])
    answer = attacked_stub.Encode(request, timeout=DEADLINE_S)
    grown = peak_rss(attacked.process.pid) - before
    reliability_report.add("adversarial attack", "3 texts of 2 MiB of words", expected="answered, RSS < 256 MiB more", actual=f"{grown / 2**20:.0f} MiB more")
    assert [result.id for result in answer.results] == ["0", "1", "2"]
    # The same as the text cut to what the model reads.
    short = attacked_stub.Encode(inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(text="a " * 200)]), timeout=DEADLINE_S)
    assert stacked([answer.results[0].dense]).tolist() == stacked([short.results[0].dense]).tolist()
    assert grown < RSS_BOUND_BYTES
    assert known(attacked_stub) == 1


def test_long_score_items_are_tokenized_only_as_far_as_a_pair_reads(attacked, attacked_stub, reliability_report) -> None:
    """A cross-encoder tokenized each (query, item) pair whole before truncating it: on main three items of
    2 MiB of one-letter words added 1.2 GB to the worker (seven: 1.9 GB, 26 s)."""
    before = peak_rss(attacked.process.pid)
    request = inference_pb2.ScoreRequest(
        model=RERANKER, query=types_pb2.Item(text="a query"), items=[types_pb2.Item(id=str(index), text="a " * 2**20) for index in range(3)]
    )
    answer = attacked_stub.Score(request, timeout=DEADLINE_S)
    grown = peak_rss(attacked.process.pid) - before
    reliability_report.add("adversarial attack", "score: 3 items of 2 MiB of words", expected="answered, RSS < 256 MiB more", actual=f"{grown / 2**20:.0f} MiB more")
    # The same scores as the items cut to what the pair reads.
    short = attacked_stub.Score(
        inference_pb2.ScoreRequest(model=RERANKER, query=types_pb2.Item(text="a query"), items=[types_pb2.Item(id="0", text="a " * 300)]), timeout=DEADLINE_S
    )
    assert sorted(entry.item_id for entry in answer.scores) == ["0", "1", "2"]
    assert [entry.score for entry in answer.scores] == pytest.approx([short.scores[0].score] * 3, rel=1e-5)
    assert grown < RSS_BOUND_BYTES
    assert known(attacked_stub) == 1


def test_an_instruction_at_its_bound_times_many_items_is_tokenized_only_as_far_as_the_model_reads(attacked, attacked_stub, reliability_report) -> None:
    """The instruction is prepended to every item: on main 16 KiB of it (SIE_MAX_INSTRUCTION_BYTES) with 512
    one-word items was 8 MiB of text tokenized whole, adding 735 MiB (8,192 items: 134 MB of text, many GB)."""
    before = peak_rss(attacked.process.pid)
    request = inference_pb2.EncodeRequest(model=KNOWN_MODEL, instruction="a " * 8192, items=[types_pb2.Item(id=str(index), text="x") for index in range(512)])
    answer = attacked_stub.Encode(request, timeout=DEADLINE_S)
    grown = peak_rss(attacked.process.pid) - before
    reliability_report.add("adversarial attack", "16 KiB instruction x 512 items", expected="answered, RSS < 256 MiB more", actual=f"{grown / 2**20:.0f} MiB more")
    assert len(answer.results) == 512
    assert grown < RSS_BOUND_BYTES
    assert known(attacked_stub) == 1


# --- pools: another token's pool -------------------------------------------------------------------------------


def test_only_the_token_that_created_a_pool_may_renew_or_delete_it(cluster, reliability_report) -> None:
    """On main any caller could delete another token's pool (revoking its lease and its workers), or renew it
    forever past the owner's TTL, though the record names its owner."""
    from local_cluster import gateway_model, wait_until

    cluster.start_worker("w1", SIE_PRELOAD_MODELS=KNOWN_MODEL, SIE_AUTH_MODE="static", SIE_AUTH_TOKENS="alice-token,mallory-token", SIE_WORKER_TOKEN="work")
    gateway = cluster.start_gateway(
        SIE_POOLS_ENABLED="true", SIE_AUTH_MODE="static", SIE_AUTH_TOKENS="alice-token,mallory-token", SIE_WORKER_TOKEN="work",
        SIE_ALLOW_UNAUTHENTICATED_WORKERS="true",  # the test's etcd has no authentication
    )
    alice, mallory = (("authorization", "Bearer alice-token"),), (("authorization", "Bearer mallory-token"),)
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: gateway_model(stub, KNOWN_MODEL, alice).loaded_on == ["w1"], what="worker registered")
        stub.CreatePool(inference_pb2.CreatePoolRequest(name="alices", gpus={"default": 1}, ttl_s=60), metadata=alice, timeout=30)
        for name, call in {
            "DeletePool": lambda: stub.DeletePool(inference_pb2.DeletePoolRequest(name="alices"), metadata=mallory, timeout=30),
            "RenewPool": lambda: stub.RenewPool(inference_pb2.RenewPoolRequest(name="alices"), metadata=mallory, timeout=30),
        }.items():
            with pytest.raises(grpc.RpcError) as raised:
                call()
            error = raised.value
            reliability_report.add("adversarial attack", f"{name} of another token's pool", expected="PERMISSION_DENIED POOL_NOT_OWNED", actual=outcome(error))
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
            assert error_info(error).reason == "POOL_NOT_OWNED"
        assert stub.RenewPool(inference_pb2.RenewPoolRequest(name="alices"), metadata=alice, timeout=30).pool.name == "alices"
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="alices"), metadata=alice, timeout=30)
        answer = stub.Encode(inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(text="still served")]), metadata=mallory, timeout=60)
        assert len(answer.results) == 1


# --- EncodeStream callers that never read, straight to a worker ----------------------------------------------

HOG_STREAMS = 40
HOG_SECONDS = 20
HOG_TEXT = "word " * 6500  # ~32 KB: the tokenizer reads a prefix, the transport carries it all
# Growth of the worker's resident memory allowed while the callers write: with grpc's BDP probe on (before the
# fix), HTTP/2 receive windows widened until 0.7-2.6 GB of unread requests sat in the worker.
HOG_RSS_BOUND_MB = 300


def vm_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


def test_encode_stream_callers_that_never_read_do_not_grow_the_worker(start_worker, reliability_report) -> None:
    """40 EncodeStream callers each write 32 KB requests as fast as the transport takes them and read nothing
    back: HTTP/2 flow control (fixed windows, no BDP probe) holds the writers back, so the worker's memory stays
    bounded and it keeps answering others."""
    worker = start_worker(SIE_PRELOAD_MODELS=KNOWN_MODEL)
    with grpc.insecure_channel(worker.address) as channel:
        assert known(inference_pb2_grpc.InferenceStub(channel)) == 1
    baseline = vm_rss_mb(worker.pid)
    request = inference_pb2.EncodeStreamRequest(request=inference_pb2.EncodeRequest(model=KNOWN_MODEL, items=[types_pb2.Item(text=HOG_TEXT)]))
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
                peak = max(peak, vm_rss_mb(worker.pid))
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
