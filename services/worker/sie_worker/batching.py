"""The BatchFormer: pending items grouped by what lets them share a forward pass.

The device loop pulls: `next_batch()` returns as soon as some group is ready
(its token cost reached the budget, it holds enough items, or its oldest item
has waited the full window), so while the device is busy items pile up and
the next batch comes out larger. A batch always takes its group's oldest
item (nothing starves), then fills with the group's shortest items first so
sequences of similar length are padded together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BatchLimits:
    max_items: int
    max_tokens: int
    max_wait_s: float


@dataclass(eq=False)
class PendingItem:
    """One item waiting for the device. `cost` is its token count."""

    key: Hashable
    cost: int
    payload: Any
    future: asyncio.Future
    enqueued_at: float = field(default_factory=time.monotonic)


@dataclass
class _Group:
    limits: BatchLimits
    items: list[PendingItem] = field(default_factory=list)
    cost: int = 0


class BatchFormer:
    def __init__(self) -> None:
        self._groups: dict[Hashable, _Group] = {}
        self._changed = asyncio.Event()

    def add(self, items: Sequence[PendingItem], limits: BatchLimits) -> None:
        """Queue items; all share `items[0].key` and the limits of that group."""
        for item in items:
            group = self._groups.setdefault(item.key, _Group(limits))
            group.items.append(item)
            group.cost += item.cost
        self._changed.set()

    @property
    def pending(self) -> int:
        return sum(len(group.items) for group in self._groups.values())

    async def next_batch(self) -> list[PendingItem]:
        """Wait until a group is ready and take one batch from it, sorted by cost."""
        while True:
            self._drop_abandoned()
            now = time.monotonic()
            ready_key, wake_at = self._ready(now)
            if ready_key is not None:
                return self._take(ready_key)
            self._changed.clear()
            timeout = None if wake_at is None else max(0.0, wake_at - now)
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                pass

    def _ready(self, now: float) -> tuple[Hashable | None, float | None]:
        """The ready group whose oldest item is oldest, else when the next one will be."""
        ready: tuple[float, Hashable] | None = None
        wake_at: float | None = None
        for key, group in self._groups.items():
            oldest = group.items[0].enqueued_at
            deadline = oldest + group.limits.max_wait_s
            full = len(group.items) >= group.limits.max_items or group.cost >= group.limits.max_tokens
            if full or now >= deadline:
                if ready is None or oldest < ready[0]:
                    ready = (oldest, key)
            elif wake_at is None or deadline < wake_at:
                wake_at = deadline
        return (ready[1] if ready else None), wake_at

    def _take(self, key: Hashable) -> list[PendingItem]:
        group = self._groups[key]
        oldest, rest = group.items[0], group.items[1:]
        batch = [oldest]
        longest = oldest.cost
        for item in sorted(rest, key=lambda pending: pending.cost):
            if len(batch) >= group.limits.max_items:
                break
            padded = (len(batch) + 1) * max(longest, item.cost)
            if padded > group.limits.max_tokens:
                break
            batch.append(item)
            longest = max(longest, item.cost)
        taken = set(map(id, batch))
        group.items = [item for item in group.items if id(item) not in taken]
        group.cost -= sum(item.cost for item in batch)
        if not group.items:
            del self._groups[key]
        return sorted(batch, key=lambda pending: pending.cost)

    def _drop_abandoned(self) -> None:
        """Forget items whose caller went away (cancelled futures)."""
        for key in list(self._groups):
            group = self._groups[key]
            live = [item for item in group.items if not item.future.done()]
            if len(live) != len(group.items):
                group.items = live
                group.cost = sum(item.cost for item in live)
                if not live:
                    del self._groups[key]
