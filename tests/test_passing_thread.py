"""Model builds run in a thread that ends, so its OpenMP pool does not outlive them (sie_worker.models.passing_thread)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from sie_worker.models.passing_thread import in_passing_thread

REQUEST = contextvars.ContextVar("request", default="")


def test_returns_the_value_from_another_thread_that_then_ends() -> None:
    def build(factor: int) -> tuple[int, threading.Thread, str]:
        return 6 * factor, threading.current_thread(), REQUEST.get()

    async def main() -> tuple[int, threading.Thread, str, bool]:
        REQUEST.set("r-1")
        value, ran_in, context = await in_passing_thread(build, 7)
        ran_in.join(timeout=5)  # while the loop (and asyncio's shared executor) still runs
        return value, ran_in, context, ran_in.is_alive()

    value, ran_in, context, alive = asyncio.run(main())
    assert (value, context) == (42, "r-1")
    assert ran_in is not threading.main_thread()
    assert not alive


def test_an_exception_reaches_the_caller_and_the_thread_still_ends() -> None:
    threads: list[threading.Thread] = []

    def fails() -> None:
        threads.append(threading.current_thread())
        raise ValueError("bad weights")

    async def main() -> bool:
        with pytest.raises(ValueError, match="bad weights"):
            await in_passing_thread(fails)
        threads[0].join(timeout=5)
        return threads[0].is_alive()

    assert not asyncio.run(main())
