"""HTTP bodies and gRPC reads share the gateway's request budget (BodyBudget) and drop a stalled upload for room the same
way: only after waiting EVICT_AFTER_WAITING_S (0.25 s) for room that bodies sent at once give back sooner. gRPC reads
waited; an HTTP body's chunk that found no room dropped a stalled upload (408 to its caller) at once, although the
room came back milliseconds later (issue 32). In-process: the adapter's read_body over the budget, bodies as stand-ins
for aiohttp's requests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from sie_gateway.http_adapter.bodies import EVICT_AFTER_WAITING_S, BodyBudget, BodyLimits, read_body
from sie_gateway.http_adapter.errors import AdapterError

MiB = 2**20
LIMITS = BodyLimits(
    max_bytes=16 * MiB, max_depth=64, max_container_len=1_000_000, max_values=1_000_000, read_timeout_s=30
)


class Body:
    """What read_body reads of an aiohttp request: its content-length and its chunks as they come."""

    def __init__(self, chunks: list[bytes], pause_s: float = 0.0, stall: asyncio.Event | None = None) -> None:
        self.content_length = sum(map(len, chunks)) + (1 if stall else 0)
        self.content = self
        self._chunks = chunks
        self._pause_s = pause_s
        self._stall = stall

    async def iter_any(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            await asyncio.sleep(self._pause_s)
            yield chunk
        if self._stall is not None:  # the rest never comes (until the test ends)
            await self._stall.wait()


async def three_bodies(room_back_after_s: float) -> tuple[str, str]:
    """A stalled upload holding 1 MiB, a body sent at once holding 2 MiB until `room_back_after_s`, and a third body
    whose 1 MiB chunk finds no room in the 3 MiB budget: (what became of the stalled upload, of the third body)."""
    budget = BodyBudget(limit=3 * MiB, caller_limit=3 * MiB, evict_after_s=0.0)
    stall = asyncio.Event()

    async def outcome(caller: str, body: Body, hold_s: float = 0.0) -> str:
        with budget.lease(caller) as lease:
            try:
                await read_body(body, LIMITS, lease)  # type: ignore[arg-type]
            except AdapterError as error:
                return f"{error.status} {error.reason}"
            await asyncio.sleep(hold_s)  # answered after this
            return "read"

    stalled = asyncio.create_task(outcome("a", Body([b"x" * MiB], stall=stall)))
    await asyncio.sleep(0.05)
    quick = asyncio.create_task(outcome("b", Body([b"x" * (2 * MiB)]), hold_s=room_back_after_s))
    await asyncio.sleep(0.01)
    third = await outcome("c", Body([b"x" * MiB]))
    await quick
    await asyncio.sleep(0.05)
    stall.set()
    return await stalled, third


def test_a_chunk_waits_for_room_given_back_at_once_rather_than_drop_a_stalled_upload() -> None:
    stalled, third = asyncio.run(three_bodies(room_back_after_s=0.05))
    assert (stalled, third) == ("read", "read")


def test_a_chunk_that_waited_in_vain_drops_the_stalled_upload() -> None:
    stalled, third = asyncio.run(three_bodies(room_back_after_s=EVICT_AFTER_WAITING_S * 4))
    assert (stalled, third) == ("408 REQUEST_TIMEOUT", "read")


def test_the_wait_is_no_longer_than_the_grpc_reads() -> None:
    """A chunk with no room and nothing to drop is refused after the same wait as a gRPC read, not sooner or later."""

    async def refused_after() -> float:
        budget = BodyBudget(limit=MiB, caller_limit=MiB, evict_after_s=60.0)
        with budget.lease("a") as holder:
            holder.grow(MiB)
            with budget.lease("b") as lease:
                started = asyncio.get_running_loop().time()
                with pytest.raises(AdapterError) as refused:
                    await read_body(Body([b"x" * 1000]), LIMITS, lease)  # type: ignore[arg-type]
                assert refused.value.reason == "OVERLOADED"
                return asyncio.get_running_loop().time() - started

    waited = asyncio.run(refused_after())
    assert EVICT_AFTER_WAITING_S <= waited < EVICT_AFTER_WAITING_S + 1.0
