"""Adaptive batching: one controller per loaded model profile.

It moves the batch wait between SIE_ADAPTIVE_MIN_QUANTUM_MS and
SIE_ADAPTIVE_MAX_QUANTUM_MS, and the token budget between an eighth of the
profile's maximum and that maximum, so that the p50 of the items' batching
latency (entering the BatchFormer to the end of their forward pass) tracks
the target: SIE_ADAPTIVE_TARGET_P50_MS, or when that is 0, one derived from
the measured forward time.

Once per control period (at least 8 batches and 100 ms, or 2 s with any
batch; batches from before the model sat idle for 2 s are left out) it looks
at that period's batches and takes at most one step:

1. The wait collected nothing (batches the wait flushed drew under 1.5
   arrivals on average, none filled up): halve the wait; once it is at the
   floor, turn it off (0), so a lone item runs as soon as the device is free.
   Light load. The first period in which batching pays again puts it back at
   the floor (step 2 or 3).
2. p50 above target x 1.2: if the batch wait is a real share of latency
   (the median wait at least a quarter of p50), wait x 0.75; else, if forward
   passes alone take over half the target, budget x 0.75; else latency is
   queueing, not waiting (the wait under a tenth of p50): while batching pays,
   wait x 1.25 + 0.5 ms, as fewer, larger batches drain the queue faster.
3. p50 below target x 0.8 and batching pays (2 or more arrivals a batch, or
   full batches): wait x 1.25 + 0.5 ms, budget x 1.25.
4. Otherwise hold.

The median over a period, the dead band around the target, bounded
multiplicative steps (down faster than up), the gap between the wait shares
that lower (a quarter) and raise (a tenth) it, and the budget moving only when
the wait is not the cause keep it from oscillating under a step in load.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Protocol

from sie_common.cluster.model_config import Profile
from sie_worker.batching.former import Batch, BatchLimits
from sie_worker.settings import WorkerSettings

PERIOD_MIN_BATCHES = 8
PERIOD_MIN_S = 0.1
PERIOD_MAX_S = 2.0
DEAD_BAND = 0.2
LIGHT_ARRIVALS = 1.5
BATCHING_PAYS_ARRIVALS = 2.0
# Over the target: the wait's share of p50 at or above which it is shortened, and under which it may grow.
WAIT_SHARE_HIGH = 0.25
WAIT_SHARE_LOW = 0.1
WAIT_DOWN_LIGHT = 0.5
DOWN = 0.75
UP = 1.25
WAIT_UP_S = 0.0005
BUDGET_FLOOR_FRACTION = 8
# Smoothing of the forward time a derived target is built from.
FORWARD_SMOOTHING = 0.3


class BatchPolicy(Protocol):
    """Where a model's batch limits come from, told about every forward pass."""

    adaptive: bool

    def current(self) -> BatchLimits: ...

    @property
    def target_p50_s(self) -> float: ...

    def observe(self, batch: Batch, started: float, finished: float) -> None: ...


@dataclass
class FixedBatching:
    """SIE_MAX_BATCH_WAIT_MS and the profile's budget, unchanged (a profile with adaptive_batching: false)."""

    limits: BatchLimits
    adaptive: bool = False

    def current(self) -> BatchLimits:
        return self.limits

    @property
    def target_p50_s(self) -> float:
        return 0.0

    def observe(self, batch: Batch, started: float, finished: float) -> None:
        """Nothing to adapt."""


@dataclass
class _Period:
    started: float
    latencies: list[float] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)
    # Per batch: its oldest item's wait until the batch was formed.
    waits: list[float] = field(default_factory=list)
    full: int = 0
    wait_flushed: int = 0
    wait_flushed_arrivals: int = 0
    last_finished: float = 0.0


class AdaptiveBatching:
    """Moves the wait and the token budget so the p50 of batching latency tracks the target (module docstring)."""

    adaptive = True

    def __init__(
        self,
        *,
        max_items: int,
        max_tokens: int,
        min_wait_s: float,
        max_wait_s: float,
        initial_wait_s: float,
        target_p50_s: float,
    ) -> None:
        self._max_tokens = max_tokens
        self._min_tokens = max(1, max_tokens // BUDGET_FLOOR_FRACTION)
        self._min_wait = min_wait_s
        self._max_wait = max_wait_s
        self._target = target_p50_s
        self._forward_s = 0.0
        self._limits = BatchLimits(max_items, max_tokens, min(max_wait_s, max(min_wait_s, initial_wait_s)))
        self._period: _Period | None = None

    def current(self) -> BatchLimits:
        return self._limits

    @property
    def target_p50_s(self) -> float:
        """The set target; without one, the longest wait plus two forward passes (this one and one queued ahead)."""
        if self._target > 0:
            return self._target
        return self._max_wait + 2 * self._forward_s

    def observe(self, batch: Batch, started: float, finished: float) -> None:
        period = self._period or _Period(started=batch.formed_at)
        if period.forward and min(item.enqueued_at for item in batch) - period.last_finished > PERIOD_MAX_S:
            # The model sat idle for longer than a period: what came before was another load; act on what comes now.
            period = _Period(started=period.started)
        self._period = period
        period.last_finished = finished
        period.latencies.extend(finished - item.enqueued_at for item in batch)
        period.forward.append(finished - started)
        period.waits.append(batch.formed_at - min(item.enqueued_at for item in batch))
        if batch.full:
            period.full += 1
        else:
            period.wait_flushed += 1
            period.wait_flushed_arrivals += batch.arrivals
        elapsed = finished - period.started
        if (len(period.forward) >= PERIOD_MIN_BATCHES and elapsed >= PERIOD_MIN_S) or elapsed >= PERIOD_MAX_S:
            self._step(period)
            self._period = _Period(started=finished)

    def _step(self, period: _Period) -> None:
        forward = statistics.median(period.forward)
        self._forward_s = (
            forward if not self._forward_s else (1 - FORWARD_SMOOTHING) * self._forward_s + FORWARD_SMOOTHING * forward
        )
        p50 = statistics.median(period.latencies)
        target = self.target_p50_s
        wait, budget = self._limits.max_wait_s, self._limits.max_tokens
        arrivals = period.wait_flushed_arrivals / period.wait_flushed if period.wait_flushed else float("inf")
        batching_pays = bool(period.full) or arrivals >= BATCHING_PAYS_ARRIVALS
        wait_share = statistics.median(period.waits) / p50 if p50 > 0 else 0.0
        if not period.full and arrivals < LIGHT_ARRIVALS:
            wait = 0.0 if wait <= self._min_wait else wait * WAIT_DOWN_LIGHT
        elif p50 > target * (1 + DEAD_BAND):
            if wait_share >= WAIT_SHARE_HIGH and wait > self._min_wait:
                wait *= DOWN
            elif forward > target / 2:
                budget = int(budget * DOWN)
            elif wait_share < WAIT_SHARE_LOW and batching_pays:
                wait = wait * UP + WAIT_UP_S
        elif p50 < target * (1 - DEAD_BAND) and batching_pays:
            wait = wait * UP + WAIT_UP_S
            budget = int(budget * UP)
        self._limits = BatchLimits(
            self._limits.max_items,
            min(self._max_tokens, max(self._min_tokens, budget)),
            self._bounded(wait),
        )

    def _bounded(self, wait: float) -> float:
        """The wait between the floor and the ceiling; 0 stays 0 (light load turned the wait off)."""
        return 0.0 if wait == 0.0 else min(self._max_wait, max(self._min_wait, wait))


def batching_for(settings: WorkerSettings, profile: Profile) -> BatchPolicy:
    """The batch policy of a loaded model profile: its adaptive_batching, else SIE_ADAPTIVE_BATCHING."""
    max_tokens = profile.max_batch_tokens or settings.max_batch_tokens
    if not (settings.adaptive_batching if profile.adaptive_batching is None else profile.adaptive_batching):
        return FixedBatching(BatchLimits(settings.max_batch_requests, max_tokens, settings.max_batch_wait_ms / 1000))
    return AdaptiveBatching(
        max_items=settings.max_batch_requests,
        max_tokens=max_tokens,
        min_wait_s=settings.adaptive_min_quantum_ms / 1000,
        max_wait_s=settings.adaptive_max_quantum_ms / 1000,
        initial_wait_s=settings.max_batch_wait_ms / 1000,
        target_p50_s=settings.adaptive_target_p50_ms / 1000,
    )
