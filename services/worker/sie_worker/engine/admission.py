"""Admission: at most SIE_MAX_CONCURRENT_REQUESTS requests in flight (QUEUE_FULL beyond), none once draining.

A drain waits for the requests admitted and for the calls still answering (`answering`: from a call's arrival
until its answer is built, which outlasts the admission by the building of the answer).
"""

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
        self._answering = 0
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

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Count a call until its answer is built, so that a drain waits for it (it is refused if it comes after
        the drain began)."""
        self._answering += 1
        try:
            yield
        finally:
            self._answering -= 1

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests and wait for those in flight and the calls answering; False if the deadline passed
        first."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while (self._in_flight or self._answering) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return not (self._in_flight or self._answering)
