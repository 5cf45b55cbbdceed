"""What each forward pass looked like (SIE_INSTRUMENTATION), as Prometheus metrics and debug records.

Items, tokens and forward time of every pass are sie_worker.metrics' (always
recorded). The controller's current setting (wait, budget, target) is
checked on every forward pass and published where it changed, whatever
SIE_INSTRUMENTATION says; the flush
counter, padding and wait histograms and the debug records in responses only
with it on.
"""

from __future__ import annotations

from dataclasses import dataclass

from sie_common.runtime.metric_labels import ClosedSet, counter, gauge, histogram
from sie_worker.batching.adaptive import BatchPolicy
from sie_worker.batching.former import Batch
from sie_worker.metrics import MODEL_PROFILE

_SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)

BATCHES = counter(
    "sie_worker_batches_total",
    "Forward passes, by what flushed the batch (full or wait).",
    {**MODEL_PROFILE, "flush": ClosedSet(["full", "wait"])},
)
PADDING = histogram(
    "sie_worker_batch_padding_fraction",
    "Share of a forward pass's tokens that are padding.",
    MODEL_PROFILE,
    (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8),
)
WAIT = histogram(
    "sie_worker_batch_wait_seconds", "The oldest item's wait until its batch was formed.", MODEL_PROFILE, _SECONDS
)
WAIT_SETTING = gauge(
    "sie_worker_batch_wait_setting_seconds", "The batch wait the model's batcher applies now.", MODEL_PROFILE
)
BUDGET_SETTING = gauge(
    "sie_worker_batch_budget_tokens", "The token budget the model's batcher applies now.", MODEL_PROFILE
)
TARGET = gauge(
    "sie_worker_batch_target_p50_seconds", "The adaptive controller's p50 target (0: fixed batching).", MODEL_PROFILE
)


@dataclass(frozen=True)
class BatchStats:
    batch_id: int
    items: int
    arrivals: int
    tokens: int
    padded_tokens: int
    wait_ms: float
    staged_ms: float
    inference_ms: float
    full: bool
    wait_setting_ms: float
    budget_tokens: int
    target_p50_ms: float
    adaptive: bool

    @property
    def padding_fraction(self) -> float:
        return 1 - self.tokens / self.padded_tokens if self.padded_tokens else 0.0


def describe(batch_id: int, batch: Batch, policy: BatchPolicy, started: float, finished: float) -> BatchStats:
    """One forward pass that started and finished at these time.monotonic() instants."""
    return BatchStats(
        batch_id=batch_id,
        items=len(batch),
        arrivals=batch.arrivals,
        tokens=batch.tokens,
        padded_tokens=batch.padded_tokens,
        wait_ms=(batch.formed_at - min(item.enqueued_at for item in batch)) * 1000,
        staged_ms=(started - batch.formed_at) * 1000,
        inference_ms=(finished - started) * 1000,
        full=batch.full,
        wait_setting_ms=batch.limits.max_wait_s * 1000,
        budget_tokens=batch.limits.max_tokens,
        target_p50_ms=policy.target_p50_s * 1000,
        adaptive=policy.adaptive,
    )


def publish_setting(model: str, profile: str, policy: BatchPolicy) -> None:
    """The policy's current setting on its gauges, where it changed since the model's last pass (unchanged, as it
    mostly is, the three label look-ups and writes are skipped: they were a tenth of a lone query's time around its
    forward pass)."""
    limits = policy.current()
    setting = (limits.max_wait_s, limits.max_tokens, policy.target_p50_s)
    if _published.get((model, profile)) == setting:
        return
    WAIT_SETTING.labels(model, profile).set(limits.max_wait_s)
    BUDGET_SETTING.labels(model, profile).set(limits.max_tokens)
    TARGET.labels(model, profile).set(policy.target_p50_s)
    _published[(model, profile)] = setting


# Each (model, profile)'s setting as last published: one entry per model and profile loaded since the start.
_published: dict[tuple[str, str], tuple[float, int, float]] = {}


def record(model: str, profile: str, stats: BatchStats) -> None:
    BATCHES.labels(model, profile, "full" if stats.full else "wait").inc()
    PADDING.labels(model, profile).observe(stats.padding_fraction)
    WAIT.labels(model, profile).observe(stats.wait_ms / 1000)
