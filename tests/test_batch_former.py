"""BatchFormer decisions: when a batch flushes, what it takes, and what may share it."""

from __future__ import annotations

import asyncio
import time

from sie_worker.batching.former import BatchFormer, BatchLimits, PendingItem

LIMITS = BatchLimits(max_items=4, max_tokens=100, max_wait_s=0.05)


def items(key: str, costs: list[int]) -> list[PendingItem]:
    loop = asyncio.get_running_loop()
    return [PendingItem(key, cost, f"{key}{index}", loop.create_future()) for index, cost in enumerate(costs)]


async def test_flushes_at_once_when_the_item_cap_is_reached() -> None:
    former = BatchFormer()
    former.add(items("a", [1, 1, 1, 1, 1]), BatchLimits(max_items=4, max_tokens=100, max_wait_s=60))
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert len(batch) == 4
    assert former.pending == 1


async def test_flushes_at_once_when_the_token_budget_is_reached() -> None:
    former = BatchFormer()
    former.add(items("a", [30, 30, 30, 30]), BatchLimits(max_items=64, max_tokens=100, max_wait_s=60))
    batch = await asyncio.wait_for(former.next_batch(), 1)
    # Padded cost: 3 items x 30 tokens fit in 100, a fourth would not.
    assert [item.cost for item in batch] == [30, 30, 30]


async def test_a_lone_item_waits_for_the_window_then_goes() -> None:
    former = BatchFormer()
    former.add(items("a", [5]), LIMITS)
    started = time.monotonic()
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert len(batch) == 1
    assert time.monotonic() - started >= LIMITS.max_wait_s * 0.9


async def test_items_that_arrive_within_the_window_share_a_batch() -> None:
    former = BatchFormer()
    former.add(items("a", [5]), LIMITS)
    waiting = asyncio.create_task(former.next_batch())
    await asyncio.sleep(0.01)
    former.add(items("b", [6]), LIMITS)  # another key: not in this batch
    former.add(items("a", [7]), LIMITS)
    batch = await asyncio.wait_for(waiting, 1)
    assert sorted(item.cost for item in batch) == [5, 7]
    assert {item.key for item in batch} == {"a"}
    assert former.pending == 1


async def test_only_items_with_the_same_key_share_a_batch() -> None:
    former = BatchFormer()
    former.add(items("a", [1, 1]), LIMITS)
    former.add(items("b", [1, 1]), LIMITS)
    first = await asyncio.wait_for(former.next_batch(), 1)
    second = await asyncio.wait_for(former.next_batch(), 1)
    assert {item.key for item in first} == {"a"}  # the older group first
    assert {item.key for item in second} == {"b"}


async def test_batch_keeps_the_oldest_item_and_fills_with_the_nearest_shorter_ones() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=3, max_tokens=1000, max_wait_s=0)
    former.add(items("a", [50, 40, 3, 30, 2]), limits)
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.cost for item in batch] == [30, 40, 50]  # no padding above the oldest's 50; sorted by cost
    assert batch.padded_tokens == 150
    rest = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.cost for item in rest] == [2, 3]


async def test_with_too_few_shorter_items_the_batch_takes_the_shortest_longer_ones() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    former.add(items("a", [20, 90, 10, 40, 60]), limits)
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.cost for item in batch] == [10, 20, 40, 60]
    rest = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.cost for item in rest] == [90]


async def test_equal_lengths_go_oldest_first() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=2, max_tokens=1000, max_wait_s=0)
    former.add(items("a", [5, 5, 5, 5]), limits)
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert sorted(item.payload for item in batch) == ["a0", "a1"]


async def test_discarded_items_are_dropped() -> None:
    former = BatchFormer()
    pending = items("a", [1, 1, 1])
    former.add(pending, BatchLimits(max_items=64, max_tokens=100, max_wait_s=0))
    pending[1].future.cancel()
    former.discard(pending[1:2])
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.payload for item in batch] == ["a0", "a2"]


async def test_an_item_over_the_budget_still_runs_alone() -> None:
    former = BatchFormer()
    former.add(items("a", [500, 1]), LIMITS)
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.cost for item in batch] == [500]


async def test_a_later_request_on_another_model_goes_before_the_rest_of_a_bulk_one() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    former.add(items("bulk", [10] * 40), limits)
    await asyncio.wait_for(former.next_batch(), 1)
    former.add(items("small", [10]), limits)
    batch = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.payload for item in batch] == ["small0"]


async def test_a_later_request_on_the_same_model_leads_the_next_batch() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    bulk = items("a", [10] * 40)
    former.add(bulk, limits)
    await asyncio.wait_for(former.next_batch(), 1)
    small = PendingItem("a", 10, "small", asyncio.get_running_loop().create_future())
    former.add([small], limits)
    batch = await asyncio.wait_for(former.next_batch(), 1)
    # It leads the batch, and the bulk's items join it only within its own span of virtual time (one item's cost).
    assert small in batch and len(batch) <= 2


async def test_requests_that_arrive_together_share_batches() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=64, max_tokens=10_000, max_wait_s=0.02)
    for client in range(8):
        former.add(items("a", [10 + client] * 5), limits)
    first = await asyncio.wait_for(former.next_batch(), 1)
    second = await asyncio.wait_for(former.next_batch(), 1)
    # Every request has items in the first pass, as much of its cost as the lead's request spans (the 10-token
    # request's 50 tokens); what is left of the longer ones goes in the next.
    assert {item.flow for item in first} == set(range(1, 9)) and len(first) >= 30
    assert len(first) + len(second) == 40


async def test_a_sequential_small_client_and_a_bulk_request_take_turns() -> None:
    """One small request at a time (a client waiting for each answer) beside a bulk one: the small request never
    waits for more than one bulk batch, and the bulk request gets a batch per four one-item requests (by cost)."""
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    former.add(items("bulk", [10] * 400), limits)
    turns = ""
    waiting: PendingItem | None = None
    for number in range(25):
        if waiting is None:
            [waiting] = items(f"small{number}", [10])
            former.add([waiting], limits)
        batch = await asyncio.wait_for(former.next_batch(), 1)
        turns += "B" if batch[0].key == "bulk" else "s"
        if waiting in batch:
            waiting = None
    assert "BB" not in turns
    assert 4 <= turns.count("B") <= 7


async def test_a_batch_given_back_is_formed_again_after_the_newer_request() -> None:
    """The engine's swap: a batch staged behind the running one, not started, gives way to a request newer than it."""
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    former.add(items("bulk", [10] * 40), limits)
    await asyncio.wait_for(former.next_batch(), 1)  # running
    staged = await asyncio.wait_for(former.next_batch(), 1)
    newer = asyncio.create_task(former.next_batch(newer_than=staged.flows))
    await asyncio.sleep(0.01)
    assert not newer.done()  # the bulk's own items are not newer than the staged batch
    former.add(items("small", [10]), limits)
    assert [item.payload for item in await asyncio.wait_for(newer, 1)] == ["small0"]
    former.give_back(staged, limits)
    again = await asyncio.wait_for(former.next_batch(), 1)
    assert [item.payload for item in again] == [item.payload for item in staged]
    assert former.pending == 40 - 8  # the running batch and the staged one, formed again


async def test_only_a_draining_request_gives_way_and_only_once() -> None:
    former = BatchFormer()
    limits = BatchLimits(max_items=4, max_tokens=1000, max_wait_s=0)
    former.add(items("bulk", [10] * 12), limits)
    staged = await former.next_batch()
    assert former.may_displace(staged)  # the bulk request has items left to wait for anyway
    former.give_back(staged, limits)
    again = await former.next_batch()
    assert not former.may_displace(again)  # given back once: it runs as formed
    lone = BatchFormer()
    lone.add(items("one", [10]), limits)
    lone.add(items("two", [10]), limits)
    assert not lone.may_displace(await lone.next_batch())  # it completes its requests: never pushed back
