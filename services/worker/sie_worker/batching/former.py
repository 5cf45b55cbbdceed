"""The BatchFormer: pending items grouped by what lets them share a forward pass.

The device loop pulls: `next_batch()` returns as soon as some group is ready
(its token cost reached the budget, it holds enough items, or its oldest item
has waited the full window), so while the device is busy items pile up and
the next batch comes out larger.

Which ready group goes, and which item leads its batch, is decided by fair
queuing over arrivals (start-time fair queuing, by token cost): every `add`
(one request's items, mostly) is a flow whose items get virtual start tags
from the former's virtual time on, each one `cost` after the previous. The
ready group holding the lowest tag goes, and that item leads the batch; the
virtual time moves to where each batch's lead ends (its tag + cost), so a
stream of new requests advances it as they are served. A request that arrives
while a 4,096-item request drains starts at the current virtual time, ahead
of the bulk's remaining items, so it waits for about one batch of its
neighbour, whether that runs another model or the same one; the bulk request
still gets its share while small ones keep coming. With one flow, or flows
that do not overlap, tags follow arrival order. The lead is then filled with
the items nearest to it in length: first those no longer than it, longest
first (they add no padding), then the shortest of the longer ones, so
sequences of similar length share a forward pass. A batch spans the virtual
time of its lead's flow (from the lead's tag, the flow's pending cost in the
group): items of other flows join it only if their tags fall in that span, so
requests that arrive together share batches as before, while a 1-item
request's batch is not filled up with a bulk neighbour's items.

A group's limits come from a `LimitSource`, read afresh every time the former
decides: a fixed `BatchLimits`, or a model's adaptive controller whose wait
and budget move while items wait.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import operator
import time
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar


@dataclass(frozen=True)
class BatchLimits:
    max_items: int
    max_tokens: int
    max_wait_s: float

    def current(self) -> BatchLimits:
        """Fixed limits are their own source."""
        return self


class LimitSource(Protocol):
    def current(self) -> BatchLimits:
        """The limits to apply now."""


# What an item carries to the device (the engine's: what runs it, its prepared value).
P = TypeVar("P")


@dataclass(eq=False, slots=True)
class PendingItem(Generic[P]):
    """One item waiting for the device. `cost` is its token count; `tag` its virtual start and `enqueued_at` its
    arrival (both set by `add`)."""

    key: Hashable
    cost: int
    payload: P
    future: asyncio.Future
    enqueued_at: float = 0.0
    tag: float = 0.0
    flow: int = 0  # which `add` it came in: breaks ties between equal tags, earliest first
    displaced: bool = False  # its batch was given back once (see `may_displace`)


# Sort keys (attrgetter keeps them out of Python code: the former orders thousands of items per batch).
_ARRIVAL = operator.attrgetter("flow", "tag")
_START = operator.attrgetter("tag", "flow")
_COST = operator.attrgetter("cost")
_FLOW = operator.attrgetter("flow")


class Batch(list[PendingItem[P]]):
    """The items of one forward pass, cheapest first, with how the former decided on them."""

    def __init__(
        self, items: Iterable[PendingItem[P]], *, limits: BatchLimits, full: bool, formed_at: float, flows: int = 0
    ) -> None:
        super().__init__(items)
        self.limits = limits  # the limits it was formed under
        self.full = full  # flushed because the item cap or token budget was reached, not by the wait
        self.formed_at = formed_at  # time.monotonic() when it left the former
        self.flows = flows  # flows (`add` calls) the former had seen when it formed the batch

    @property
    def tokens(self) -> int:
        return sum(item.cost for item in self)

    @property
    def padded_tokens(self) -> int:
        """Tokens the forward pass computes: every item padded to the longest."""
        return len(self) * max((item.cost for item in self), default=0)

    @property
    def arrivals(self) -> int:
        """How many separate `add` calls (requests, mostly) the batch drew from."""
        return len({item.enqueued_at for item in self})


@dataclass
class _Group(Generic[P]):
    source: LimitSource
    items: list[PendingItem[P]] = field(default_factory=list)
    cost: int = 0


class BatchFormer(Generic[P]):
    def __init__(self) -> None:
        self._groups: dict[Hashable, _Group[P]] = {}
        self._changed = asyncio.Event()
        # Virtual time: where the latest batch's lead item ends (its tag + cost); a new flow's tags start here.
        self._virtual = 0.0
        self._flows = 0

    def add(self, items: Sequence[PendingItem[P]], limits: LimitSource) -> None:
        """Queue items that arrived together (one flow); all share `items[0].key` and the limits of that group."""
        now = time.monotonic()
        tag = self._virtual
        self._flows += 1
        for item in items:
            item.enqueued_at = now
            item.tag = tag
            item.flow = self._flows
            tag += item.cost
            group = self._groups.setdefault(item.key, _Group(limits))
            group.items.append(item)
            group.cost += item.cost
        self._changed.set()

    @property
    def pending(self) -> int:
        return sum(len(group.items) for group in self._groups.values())

    def discard(self, items: Sequence[PendingItem[P]]) -> None:
        """Forget items whose caller went away (their futures are cancelled), so no batch carries them."""
        gone = set(map(id, items))
        for key in {item.key for item in items}:
            group = self._groups.get(key)
            if group is None:
                continue
            group.items = [item for item in group.items if id(item) not in gone]
            group.cost = sum(item.cost for item in group.items)
            if not group.items:
                del self._groups[key]

    async def next_batch(self, newer_than: int | None = None) -> Batch[P]:
        """Wait until a group is ready and take one batch from it, sorted by cost.

        With `newer_than` (a batch's `flows`), only a batch led by an item of a flow added after that batch was
        formed: what may replace it on the device while it has not started (see `give_back`)."""
        while True:
            now = time.monotonic()
            ready, wake_at = self._ready(now, newer_than)
            if ready is not None:
                return self._take(*ready, now)
            self._changed.clear()
            timeout = None if wake_at is None else max(0.0, wake_at - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    def take_ready(self) -> Batch[P] | None:
        """The batch `next_batch` would return now, if a group is ready now; else None (nothing waits)."""
        now = time.monotonic()
        ready, _ = self._ready(now, None)
        return None if ready is None else self._take(*ready, now)

    def give_back(self, batch: Batch[P], limits: LimitSource) -> None:
        """Queue again, as they were, the items of a batch that did not run (another was run in its place), but for
        those whose caller went away while it waited (their futures are done: `discard` could not reach them)."""
        for item in batch:
            if item.future.done():
                continue
            item.displaced = True
            group = self._groups.setdefault(item.key, _Group(limits))
            bisect.insort(group.items, item, key=_ARRIVAL)  # a group's items stay in arrival order
            group.cost += item.cost
        self._changed.set()

    def may_displace(self, batch: Batch[P]) -> bool:
        """Whether a newer request's batch may take `batch`'s place (see `give_back`): only while every request in it
        has items left to wait for here anyway (a bulk request draining), and only once for its items.

        So a batch that completes a request is never pushed back, and one given back runs next: under many
        one-item requests nothing is displaced, and a bulk request gets at least every other pass while small
        ones keep coming."""
        if any(item.displaced for item in batch):
            return False
        waiting = {item.flow for group in self._groups.values() for item in group.items}
        return all(item.flow in waiting for item in batch)

    def _ready(
        self, now: float, newer_than: int | None
    ) -> tuple[tuple[Hashable, PendingItem[P], BatchLimits, bool] | None, float | None]:
        """The ready group holding the lowest tag (key, its lead, limits, full), else when the next one will be."""
        ready: tuple[tuple[float, int], Hashable, PendingItem[P], BatchLimits, bool] | None = None
        wake_at: float | None = None
        for key, group in self._groups.items():
            # Items are kept in arrival order, so those of flows after `newer_than` are a tail.
            candidates = (
                group.items
                if newer_than is None
                else group.items[bisect.bisect_right(group.items, newer_than, key=_FLOW) :]
            )
            if not candidates:
                continue
            limits = group.source.current()
            deadline = group.items[0].enqueued_at + limits.max_wait_s  # items are kept in arrival order
            full = len(group.items) >= limits.max_items or group.cost >= limits.max_tokens
            if full or now >= deadline:
                lead = _lead(candidates)
                order = (lead.tag, lead.flow)
                if ready is None or order < ready[0]:
                    ready = (order, key, lead, limits, full)
            elif wake_at is None or deadline < wake_at:
                wake_at = deadline
        return (ready[1:] if ready else None), wake_at

    def _take(self, key: Hashable, lead: PendingItem[P], limits: BatchLimits, full: bool, now: float) -> Batch[P]:
        group = self._groups[key]
        self._virtual = max(self._virtual, lead.tag + lead.cost)
        # The batch spans the virtual time of its lead's request: other requests' items share it only if they
        # start within that span, so a 1-item request's batch is not filled up with a bulk neighbour's items.
        horizon = lead.tag + sum(item.cost for item in group.items if item.flow == lead.flow)
        rest = [item for item in group.items if item is not lead and (item.flow == lead.flow or item.tag < horizon)]
        batch = [lead]
        longest = lead.cost
        not_longer = sorted((item for item in rest if item.cost <= lead.cost), key=_COST, reverse=True)
        longer = sorted((item for item in rest if item.cost > lead.cost), key=_COST)
        for item in (*not_longer, *longer):
            if len(batch) >= limits.max_items:
                break
            padded = (len(batch) + 1) * max(longest, item.cost)
            if padded > limits.max_tokens:
                break
            batch.append(item)
            longest = max(longest, item.cost)
        taken = set(map(id, batch))
        group.items = [item for item in group.items if id(item) not in taken]
        group.cost -= sum(item.cost for item in batch)
        if not group.items:
            del self._groups[key]
        return Batch(sorted(batch, key=_COST), limits=limits, full=full, formed_at=now, flows=self._flows)


def _lead(items: list[PendingItem[P]]) -> PendingItem[P]:
    """The item with the lowest virtual start tag, the earliest arrival among equal tags."""
    return min(items, key=_START)
