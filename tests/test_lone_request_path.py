"""A request of one part and one item through the engine (the single query the latency goal is about): it answers
as a request of several items does, with the same values, its refusals and failures, and when cancelled while
queued, nothing left behind; and where its pass runs (sie_worker.engine.threads) recovers from one stall of the
process instead of keeping every later pass on the device thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from fake_adapter import FAKE_ENCODER, FAKE_EXTRACTOR, adapter_of, fake_dense, fake_engine, items, token_ids
from sie_common.edge.errors import SieError
from sie_worker.engine import threads
from sie_worker.engine.engine import Engine
from sie_worker.engine.jobs import EncodeJob, ExtractJob
from sie_worker.engine.threads import DEVICE, INLINE, InlineChoice


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with fake_engine(tmp_path, max_batch_wait_ms=0.0, adaptive_batching=False) as built:
        yield built


async def test_a_lone_item_answers_the_values_it_gets_beside_others(engine: Engine) -> None:
    alone = await engine.encode(EncodeJob(FAKE_ENCODER, items("a lone query"), output_types=("dense", "multivector")))
    together = await engine.encode(
        EncodeJob(FAKE_ENCODER, items("first", "a lone query"), output_types=("dense", "multivector"))
    )
    assert alone.items[0].dense.values.tolist() == fake_dense(token_ids("a lone query")).tolist()
    assert alone.items[0].dense.values.tolist() == together.items[1].dense.values.tolist()
    assert alone.items[0].multivector.values.tolist() == together.items[1].multivector.values.tolist()
    assert alone.tokens == len(token_ids("a lone query"))


async def test_a_lone_items_refusal_names_it_as_among_others(engine: Engine) -> None:
    refusals = []
    for texts in (("unreadable text",), ("fine", "unreadable text")):
        with pytest.raises(SieError) as refused:
            await engine.extract(ExtractJob(FAKE_EXTRACTOR, items(*texts), labels=("text",)))
        refusals.append(refused.value)
    assert [type(refusal).__name__ for refusal in refusals] == ["InvalidArgument"] * 2
    assert refusals[0].reason == refusals[1].reason
    assert refusals[0].message == "items[0] (id 't0'): this text cannot be read"
    assert refusals[1].message == "items[1] (id 't1'): this text cannot be read"
    assert engine.in_flight == 0


async def test_a_lone_items_unexpected_preparation_error_is_raised_not_answered(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a refusal: the error itself comes out (the API answers it INTERNAL), as from a gather of parts."""

    def broken(*_: object) -> list:
        raise RuntimeError("the tokenizer broke")

    monkeypatch.setattr(adapter_of(engine, FAKE_ENCODER), "prepare", broken)
    with pytest.raises(RuntimeError, match="the tokenizer broke"):
        await engine.encode(EncodeJob(FAKE_ENCODER, items("query")))
    assert engine.in_flight == 0


async def test_a_lone_item_failing_its_pass_fails_alone(engine: Engine) -> None:
    await engine.encode(EncodeJob(FAKE_ENCODER, items("first")))
    with pytest.raises(SieError) as failed:
        await engine.encode(EncodeJob(FAKE_ENCODER, items("boom")))
    assert failed.value.reason == "ITEM_FAILED"
    after = await engine.encode(EncodeJob(FAKE_ENCODER, items("after")))
    assert after.items[0].dense.values.tolist() == fake_dense(token_ids("after")).tolist()


async def test_a_lone_item_cancelled_while_queued_leaves_nothing_behind(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waiting behind a neighbour's pass held on the device thread, then cancelled: the request ends cancelled, holds
    no admission, and the next request is served (a pass already handed to the device thread may still run; its
    outputs go to no one)."""
    fake = adapter_of(engine, FAKE_ENCODER)
    run = fake.run
    release = threading.Event()
    ran: list[list] = []

    def held(batch: list, query: object) -> object:
        ran.append(list(batch))
        if token_ids("hold") in batch:
            release.wait(10)
        return run(batch, query)

    monkeypatch.setattr(fake, "run", held)
    neighbour = asyncio.create_task(engine.encode(EncodeJob(FAKE_ENCODER, items("hold"))))
    while not ran:
        await asyncio.sleep(0.01)
    lone = asyncio.create_task(engine.encode(EncodeJob(FAKE_ENCODER, items("cancelled"))))
    await asyncio.sleep(0.05)
    assert not lone.done()
    lone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lone
    release.set()
    await asyncio.wait_for(neighbour, 10)
    served = await asyncio.wait_for(engine.encode(EncodeJob(FAKE_ENCODER, items("served"))), 10)
    assert served.items[0].dense.values.tolist() == fake_dense(token_ids("served")).tolist()
    assert engine.in_flight == 0


def test_a_size_whose_inline_average_went_over_the_limit_is_measured_again_and_recovers() -> None:
    """One stall of the process (a loaded machine) made the event loop's average for a size exceed MAX_INLINE_S:
    the size is run there again every EXPLORE_EVERY-th pass, and chosen there again once its passes are fast."""
    choice = InlineChoice(device_threads=2)
    for _ in range(threads.WARM_PASSES + 1):
        choice.observe(8, DEVICE, 0.200)
        choice.observe(8, INLINE, 0.020)
    assert choice.inline(8)
    choice.observe(8, INLINE, 5.0)  # a stall
    ways = []
    for _ in range(threads.EXPLORE_EVERY * 8):
        ways.append(choice.inline(8))
        choice.observe(8, INLINE if ways[-1] else DEVICE, 0.020 if ways[-1] else 0.200)
    again = ways.index(True)  # over the limit: on the device thread until the pass that measures again
    assert again < threads.EXPLORE_EVERY
    assert ways[again : again + threads.EXPLORE_EVERY] == [True] * threads.EXPLORE_EVERY  # fast there: chosen
    assert ways[-threads.EXPLORE_EVERY :].count(True) == threads.EXPLORE_EVERY - 1  # chosen again


def test_a_size_over_the_limit_inline_is_not_run_there_again_while_the_device_thread_is_fast() -> None:
    """Measuring again would hold the event loop longer than a pass on the device thread takes: not done."""
    choice = InlineChoice(device_threads=2)
    for _ in range(threads.WARM_PASSES + 1):
        choice.observe(8, DEVICE, 0.010)
        choice.observe(8, INLINE, 0.005)
    choice.observe(8, INLINE, 5.0)  # a stall
    ways = []
    for _ in range(threads.EXPLORE_EVERY * 4):
        ways.append(choice.inline(8))
        choice.observe(8, INLINE if ways[-1] else DEVICE, 0.005 if ways[-1] else 0.010)
    assert not any(ways)
