"""Torch work off the device thread runs in a thread of its own, which then ends.

PyTorch's CPU wheels use GNU OpenMP, which gives every thread that runs a
parallel region a pool of helper threads, kept until that thread exits.
Once the process has more OpenMP threads than cores, libgomp stops spinning
between regions and sleeps, and every region of every forward pass pays a
wake-up: on 2 cores a one-item all-MiniLM-L6-v2 pass on the device thread
took 11-13 ms after a model was built in a long-lived thread, and 5-6 ms
after it was built in a thread that had ended (docs/benchmarks.md). Model
builds (from_pretrained, weight packing) therefore run here, not in asyncio's
shared executor, whose threads live as long as the process.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


async def in_passing_thread(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a new thread (with the caller's context variables) that exits when it returns."""
    executor = ThreadPoolExecutor(1, thread_name_prefix="sie-build")
    try:
        call = functools.partial(contextvars.copy_context().run, function, *args)
        return await asyncio.get_running_loop().run_in_executor(executor, call)
    finally:
        executor.shutdown(wait=False)
