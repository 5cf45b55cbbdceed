"""Admission: at most SIE_MAX_CONCURRENT_REQUESTS requests in flight (QUEUE_FULL beyond), none once draining."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

from sie_common.edge.errors import ResourceExhausted, Unavailable


class Admission:
    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._in_flight = 0
        self._draining = False

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold one of the slots, or answer RESOURCE_EXHAUSTED (UNAVAILABLE while draining)."""
        if self._draining:
            raise Unavailable(
                "worker is shutting down; send the request to another worker",
                reason="SHUTTING_DOWN",
                retry_after_s=1.0,
            )
        if self._in_flight >= self._limit:
            raise ResourceExhausted(
                f"worker at capacity: {self._limit} requests in flight (SIE_MAX_CONCURRENT_REQUESTS); retry with "
                "backoff",
                reason="QUEUE_FULL",
                metadata={"limit": str(self._limit)},
            )
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for those in flight; False if the deadline passed first."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._in_flight == 0
