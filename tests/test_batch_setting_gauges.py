"""The batcher's setting gauges (sie_worker.batching.stats.publish_setting), published on every forward pass: a
setting that changed is on the gauges at once, and an unchanged one is not written again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from sie_worker.batching import stats
from sie_worker.batching.adaptive import FixedBatching
from sie_worker.batching.former import BatchLimits
from sie_worker.metrics import MODELS, PROFILES

MODEL = "test/setting-gauges"
LABELS = {"model": MODEL, "profile": "default"}


@pytest.fixture
def served() -> Iterator[None]:
    MODELS.follow({MODEL}.__contains__)
    PROFILES.follow({"default"}.__contains__)
    try:
        yield
    finally:
        MODELS.follow(frozenset().__contains__)
        PROFILES.follow(frozenset().__contains__)


def wait_gauge() -> float | None:
    return REGISTRY.get_sample_value("sie_worker_batch_wait_setting_seconds", LABELS)


@pytest.mark.usefixtures("served")
def test_a_changed_setting_is_published_and_an_unchanged_one_not_written_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = FixedBatching(BatchLimits(max_items=8, max_tokens=512, max_wait_s=0.004))
    stats.publish_setting(MODEL, "default", policy)
    assert wait_gauge() == pytest.approx(0.004)
    assert REGISTRY.get_sample_value("sie_worker_batch_budget_tokens", LABELS) == 512

    writes: list[tuple[str, ...]] = []
    looked_up = stats.WAIT_SETTING.labels
    monkeypatch.setattr(stats.WAIT_SETTING, "labels", lambda *values: writes.append(values) or looked_up(*values))
    for _ in range(3):
        stats.publish_setting(MODEL, "default", policy)
    assert writes == []

    policy.limits = BatchLimits(max_items=8, max_tokens=1024, max_wait_s=0.0)
    stats.publish_setting(MODEL, "default", policy)
    assert writes == [(MODEL, "default")]
    assert wait_gauge() == 0.0
    assert REGISTRY.get_sample_value("sie_worker_batch_budget_tokens", LABELS) == 1024
    stats.publish_setting(MODEL, "other-profile", policy)  # another profile's gauges are its own
    assert writes == [(MODEL, "default"), (MODEL, "other-profile")]
