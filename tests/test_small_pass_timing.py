"""What the choice of where a lone small CPU pass runs (sie_worker.engine.threads) is told of the device thread: a
pass handed to it while idle is timed until its outputs are back on the event loop, the hops included, so a busy
event loop counts against that way; passes handed behind another are not timed for it; and it takes a lone pass only
when clearly faster."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from fake_adapter import FAKE_ENCODER, adapter_of, fake_engine, items
from sie_worker.engine import threads
from sie_worker.engine.engine import Engine
from sie_worker.engine.jobs import EncodeJob
from sie_worker.engine.threads import DEVICE, INLINE, InlineChoice
from test_inline_forward_passes import warmed

# How long the event loop is held while a pass is on the device thread.
HELD_S = 0.3


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Engine]:
    async with fake_engine(tmp_path, max_batch_wait_ms=0.0, adaptive_batching=False) as built:
        yield built


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    """Each way and seconds the choice is told of; every pass goes to the device thread."""
    seen: list[tuple[str, float]] = []
    monkeypatch.setattr(InlineChoice, "inline", lambda self, padded_tokens: False)
    monkeypatch.setattr(InlineChoice, "observe", lambda self, tokens, way, seconds: seen.append((way, seconds)))
    return seen


async def test_a_device_pass_is_timed_until_its_outputs_are_back_on_the_event_loop(
    engine: Engine, observed: list[tuple[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = adapter_of(engine, FAKE_ENCODER)
    run = fake.run
    started, go = threading.Event(), threading.Event()

    def held(batch: Sequence[Any], query: Any) -> Any:
        started.set()
        go.wait(10)
        return run(batch, query)

    monkeypatch.setattr(fake, "run", held)
    request = asyncio.ensure_future(engine.encode(EncodeJob(FAKE_ENCODER, items("a lone query"))))
    while not started.is_set():
        await asyncio.sleep(0.001)
    go.set()
    time.sleep(HELD_S)  # the event loop busy while the finished pass's outputs wait to come back
    answer = await request
    assert len(answer.items) == 1
    assert [way for way, _ in observed] == [DEVICE]
    assert observed[0][1] >= HELD_S * 0.9
    assert INLINE not in {way for way, _ in observed}


async def test_a_pass_handed_behind_another_is_not_timed_for_the_choice(
    engine: Engine, observed: list[tuple[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = adapter_of(engine, FAKE_ENCODER)
    run = fake.run
    release = threading.Event()

    def held(batch: Sequence[Any], query: Any) -> Any:
        release.wait(10)
        return run(batch, query)

    monkeypatch.setattr(fake, "run", held)
    first = asyncio.ensure_future(engine.encode(EncodeJob(FAKE_ENCODER, items("first"))))
    await asyncio.sleep(0.05)  # the first pass is on the device thread, held
    second = asyncio.ensure_future(engine.encode(EncodeJob(FAKE_ENCODER, items("second", "third"))))
    await asyncio.sleep(0.05)  # the second is handed behind it
    release.set()
    await asyncio.gather(first, second)
    assert [way for way, _ in observed] == [DEVICE]


def test_a_pass_stays_on_the_event_loop_unless_the_device_thread_is_clearly_faster() -> None:
    """Measured on both ways, a device thread a little faster does not take the pass (the averages cross back and
    forth with the load); one DEVICE_MARGIN times as fast or more does."""
    close, clear = InlineChoice(device_threads=2), InlineChoice(device_threads=2)
    warmed(close, 8, device_s=0.009, inline_s=0.010)
    warmed(clear, 8, device_s=0.010 / threads.DEVICE_MARGIN / 1.1, inline_s=0.010)
    assert close.inline(8)
    assert not clear.inline(8)
