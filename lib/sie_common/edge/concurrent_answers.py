"""Answer the requests of one stream concurrently, in the order they complete.

Used by every bidirectional stream of the engine (EncodeStream, Work): each
request starts as soon as it is read, its answer is yielded when ready, and a
request can be cancelled by key while it runs. With a `limit`, the feed waits
(`room`) while that many requests are running or answered but not yet taken by
the reader: a caller that stops reading answers stops having its requests read,
so flow control reaches back to it and memory stays bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any, Generic, TypeVar

Answer = TypeVar("Answer")

# Put on the queue whenever something ends, so `stream` re-checks whether it is done.
_WAKE: Any = object()


class ConcurrentAnswers(Generic[Answer]):
    def __init__(self, limit: int | None = None) -> None:
        self._queue: asyncio.Queue[Answer] = asyncio.Queue()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._limit = limit
        # Answers in the queue that the reader has not taken yet.
        self._unread = 0
        self._changed = asyncio.Event()

    async def room(self) -> None:
        """Wait until fewer than `limit` requests are running or waiting to be read (at once without a limit)."""
        while self._limit is not None and len(self._running) + self._unread >= self._limit:
            self._changed.clear()
            await self._changed.wait()

    def start(self, key: str, answer: Awaitable[Answer]) -> bool:
        """Run `answer` (which must not raise); False when `key` is already running."""
        if key in self._running:
            if asyncio.iscoroutine(answer):
                answer.close()
            return False

        async def run() -> None:
            self._put(await answer)

        task = asyncio.create_task(run())
        self._running[key] = task
        task.add_done_callback(lambda _: self._finished(key, task))
        return True

    def reply(self, answer: Answer) -> None:
        """Answer at once (for requests refused before they start)."""
        self._put(answer)

    def _put(self, answer: Answer) -> None:
        self._unread += 1
        self._queue.put_nowait(answer)

    def cancel(self, key: str) -> bool:
        """Abandon the request running under `key`; it will not be answered."""
        task = self._running.get(key)
        if task is None:
            return False
        task.cancel()
        return True

    async def stream(self, feed: Coroutine[Any, Any, None]) -> AsyncIterator[Answer]:
        """Run `feed` (which reads requests and calls start/cancel) and yield answers until
        the feed has ended and every started request is answered or cancelled."""
        reader = asyncio.create_task(feed)
        reader.add_done_callback(lambda _: self._queue.put_nowait(_WAKE))
        try:
            while not (reader.done() and not self._running and self._queue.empty()):
                answer = await self._queue.get()
                if answer is not _WAKE:
                    self._unread -= 1
                    self._changed.set()
                    yield answer
            reader.result()  # a failed read ends the stream with its error
        finally:
            reader.cancel()
            for task in list(self._running.values()):
                task.cancel()

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        if self._running.get(key) is task:
            del self._running[key]
        self._changed.set()
        self._queue.put_nowait(_WAKE)
