"""Whether a lone small CPU forward pass runs on the event loop's thread, on one torch thread, instead of on the
device thread with all of them: whichever this model measured faster at this size here.

Handing a pass to the device thread and its outputs back costs two thread wake-ups, and torch splits each op of
the pass over its threads and waits for all of them at the op's end, some hundred times a pass for a 6-layer BERT.
For a few tokens the split saves less than those waits cost, and where other processes share the cores each wait
may last a scheduler slice: on the 2-core development machine under other sessions' load, a one-item
all-MiniLM-L6-v2 request took 15-30 ms with its pass on one thread and 200-320 ms on two (docs/benchmarks.md; with
libgomp's idle threads spinning, which the worker now turns off: sie_worker.cli). On an idle machine two threads may
still win at a few dozen tokens. So the device loop measures: per model and per size (padded tokens, in powers of
two, up to MAX_INLINE_TOKENS) it keeps a moving average of each way's seconds per token (on the event loop, the
pass; on the device thread, for a pass handed to it while idle, from the hand-over until its outputs are back on the
event loop: the hops are what a lone request pays there too), runs the faster, and every EXPLORE_EVERY-th pass of a
size the other, so the choice follows the machine's load. The loop serves no one else meanwhile, so a pass runs
there by choice only at sizes whose passes there took at most MAX_INLINE_S (tried only where the device thread's
took at most MAX_TRIED_S). A size over it whose device
passes take over MAX_INLINE_S too is still measured there every EXPLORE_EVERY-th pass: one stall of the process on
a loaded machine would otherwise send every later pass of that size to the device thread for good (seen: 200 ms
passes on two threads where one took 20 ms).

The event loop's thread runs torch on one thread and the device thread on all (`pin_threads`), set once: torch
starts each new thread with the count set last, so switching back and forth would leave model builds in new
threads on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Padded tokens (items x longest) up to which a pass may run on the event loop.
MAX_INLINE_TOKENS = 128
# The longest a pass on the event loop may take, as measured; one found slower is not run there again.
MAX_INLINE_S = 0.1
# Passes on the event loop are tried only at sizes whose passes on the device thread took at most this long (on a
# loaded machine those are slow for their waits, not their arithmetic; a large model is not tried at all).
MAX_TRIED_S = 1.0
# Passes of a size each way before the faster is chosen (the first of each is not counted: it pays for
# first-time allocations).
WARM_PASSES = 3
# Of a size's measured passes, every this-many-th runs the way not chosen.
EXPLORE_EVERY = 16
# Weight of a new pass in a way's moving average.
SMOOTHING = 0.2
# A size measured on both ways stays on the event loop unless the device thread's passes are this many times as
# fast: on a loaded machine the two averages cross back and forth with the load, and each pass sent the wrong way
# costs the hops besides (in-process, MiniLM one item at load 8: a fifth of passes went to the device thread, at
# 43 ms median against 32 on the event loop; where two threads truly win, by 1.5-2x, they still do).
DEVICE_MARGIN = 1.25

INLINE = "inline"
DEVICE = "device"


@dataclass
class _Size:
    """One size's measurements: per way, passes seen and the moving average of seconds per token."""

    passes: dict[str, int] = field(default_factory=dict)
    per_token_s: dict[str, float] = field(default_factory=dict)

    def warm(self, way: str) -> bool:
        return self.passes.get(way, 0) > WARM_PASSES


class InlineChoice:
    """Where a model's small CPU passes run (module docstring); `device_threads`: the device thread's torch threads."""

    def __init__(self, device_threads: int) -> None:
        self.device_threads = device_threads
        self._sizes: dict[int, _Size] = {}

    def inline(self, padded_tokens: int) -> bool:
        """Whether a pass of `padded_tokens` runs on the event loop; the same answer until the next `observe` of
        its size."""
        size = self._sizes.get(_size_of(padded_tokens)) if 0 < padded_tokens <= MAX_INLINE_TOKENS else None
        if size is None or not size.warm(DEVICE):
            return False
        device_s = size.per_token_s[DEVICE] * padded_tokens
        inline_s = size.per_token_s.get(INLINE, 0.0) * padded_tokens
        explore = sum(size.passes.values()) % EXPLORE_EVERY == 0
        if inline_s > MAX_INLINE_S:
            # Only to measure again, where the device thread's passes take that long too: one stall of the process
            # (a loaded machine) may have made the average, and a way never tried again would keep it, and every
            # pass of this size on the device thread, for good.
            return explore and device_s > MAX_INLINE_S
        if not size.warm(INLINE):
            return device_s <= MAX_TRIED_S
        faster = inline_s <= device_s * DEVICE_MARGIN
        return faster != explore

    def observe(self, padded_tokens: int, way: str, seconds: float) -> None:
        """A pass of `padded_tokens` took `seconds`, run `way` (INLINE or DEVICE)."""
        if not 0 < padded_tokens <= MAX_INLINE_TOKENS:
            return
        size = self._sizes.setdefault(_size_of(padded_tokens), _Size())
        seen = size.passes.get(way, 0)
        size.passes[way] = seen + 1
        if seen == 0:
            return  # first-time allocations, not the way's speed
        per_token = seconds / padded_tokens
        average = size.per_token_s.get(way)
        if average is None or (way == INLINE and average * padded_tokens > MAX_INLINE_S):
            size.per_token_s[way] = per_token  # measured again after a stall: the stall's average is not kept
        else:
            size.per_token_s[way] = average + SMOOTHING * (per_token - average)


def _size_of(padded_tokens: int) -> int:
    """Sizes in powers of two: 1, 2, 3-4, 5-8, ..."""
    return (padded_tokens - 1).bit_length()


def pin_threads(threads: int) -> None:
    """Run this thread's torch ops on `threads` threads (OpenMP's count is the calling thread's own)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
