"""The adaptive batching controller on synthetic batches: where it moves the wait and budget, and that it settles."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from sie_common.cluster.config_messages import config_from_message, config_to_message
from sie_common.cluster.model_config import ModelConfigError, Profile, parse_model_config
from sie_common.runtime.settings import SettingsError, load_settings
from sie_worker.batching.adaptive import AdaptiveBatching, FixedBatching, batching_for
from sie_worker.batching.stats import describe, publish_setting, record
from sie_worker.batching.former import Batch, BatchLimits, PendingItem
from sie_worker.metrics import MODELS, PROFILES
from sie_worker.settings import WorkerSettings

MAX_TOKENS = 8192


def controller(target_ms: float = 50.0, initial_ms: float = 10.0) -> AdaptiveBatching:
    return AdaptiveBatching(
        max_items=64, max_tokens=MAX_TOKENS, min_wait_s=0.002, max_wait_s=0.015, initial_wait_s=initial_ms / 1000, target_p50_s=target_ms / 1000
    )


class Plant:
    """A fake device fed at a steady pace: builds batches with the given shape and tells the controller about them."""

    def __init__(self, policy: AdaptiveBatching) -> None:
        self.policy = policy
        self.now = 100.0
        self.last_latency_ms = 0.0

    def run(
        self, *, batches: int, arrivals: int, latency_ms: float, forward_ms: float, full: bool = False, gap_ms: float = 20.0,
        wait_ms: float | None = None,
    ) -> None:
        """Batches whose oldest item waited `wait_ms` to be formed (default: all of its time before the pass)."""
        for _ in range(batches):
            self.now += gap_ms / 1000
            finished = self.now
            started = finished - forward_ms / 1000
            enqueued = finished - latency_ms / 1000
            items = [PendingItem("k", 10, None, None, enqueued_at=enqueued + index * 1e-6) for index in range(arrivals)]  # type: ignore[arg-type]
            formed_at = started if wait_ms is None else enqueued + wait_ms / 1000
            batch = Batch(items, limits=self.policy.current(), full=full, formed_at=formed_at)
            self.policy.observe(batch, started, finished)
        self.last_latency_ms = latency_ms

    @property
    def wait_ms(self) -> float:
        return self.policy.current().max_wait_s * 1000

    @property
    def budget(self) -> int:
        return self.policy.current().max_tokens


def test_light_load_brings_the_wait_down_to_the_floor_then_turns_it_off() -> None:
    plant = Plant(controller())
    waits = []
    for _ in range(5):
        plant.run(batches=8, arrivals=1, latency_ms=12, forward_ms=1)
        waits.append(plant.wait_ms)
    assert waits == pytest.approx([5.0, 2.5, 2.0, 0.0, 0.0])  # halved, the floor, then no wait at all
    assert plant.budget == MAX_TOKENS
    # Batching pays again (requests piled up while the device was busy): back to the floor, then up.
    plant.run(batches=8, arrivals=6, latency_ms=12, forward_ms=1)
    assert plant.wait_ms == pytest.approx(2.0)
    plant.run(batches=8, arrivals=6, latency_ms=12, forward_ms=1)
    assert plant.wait_ms == pytest.approx(2 * 1.25 + 0.5)


def test_heavy_load_with_headroom_raises_the_wait_to_the_maximum() -> None:
    plant = Plant(controller(initial_ms=2))
    waits = []
    for _ in range(12):
        plant.run(batches=8, arrivals=20, latency_ms=20, forward_ms=5, full=True)
        waits.append(plant.wait_ms)
    assert waits == sorted(waits)
    assert waits[0] == pytest.approx(2 * 1.25 + 0.5)
    assert waits[-1] == pytest.approx(15.0)
    assert plant.budget == MAX_TOKENS


def test_over_the_target_the_wait_comes_down_before_the_budget() -> None:
    plant = Plant(controller(initial_ms=15))
    plant.run(batches=8, arrivals=4, latency_ms=120, forward_ms=40)
    assert plant.wait_ms == pytest.approx(15 * 0.75)
    assert plant.budget == MAX_TOKENS
    for _ in range(40):
        plant.run(batches=8, arrivals=4, latency_ms=120, forward_ms=40)
    assert plant.wait_ms == pytest.approx(2.0)
    # Forward passes alone take over half the target: the budget shrinks, down to an eighth of the maximum.
    assert plant.budget == MAX_TOKENS // 8


def test_over_the_target_from_queueing_not_waiting_the_wait_grows() -> None:
    plant = Plant(controller(initial_ms=2))
    waits = []
    for _ in range(10):
        # Requests queue for 300 ms on a starved machine; batches formed 2-15 ms after their oldest item came.
        plant.run(batches=8, arrivals=6, latency_ms=300, forward_ms=5, wait_ms=plant.wait_ms)
        waits.append(plant.wait_ms)
    assert waits == sorted(waits) and waits[-1] == pytest.approx(15.0)
    assert plant.budget == MAX_TOKENS


def test_forward_passes_well_inside_the_target_keep_the_budget() -> None:
    plant = Plant(controller(initial_ms=2))
    for _ in range(10):
        plant.run(batches=8, arrivals=4, latency_ms=80, forward_ms=10)
    assert plant.wait_ms == pytest.approx(2.0)
    assert plant.budget == MAX_TOKENS


def test_inside_the_band_around_the_target_it_holds() -> None:
    plant = Plant(controller(initial_ms=7))
    for latency in (42, 50, 58):
        plant.run(batches=16, arrivals=4, latency_ms=latency, forward_ms=5)
        assert plant.wait_ms == pytest.approx(7.0)


def test_a_period_needs_eight_batches_or_two_seconds() -> None:
    plant = Plant(controller())
    plant.run(batches=7, arrivals=1, latency_ms=12, forward_ms=1)
    assert plant.wait_ms == pytest.approx(10.0)
    plant.run(batches=1, arrivals=1, latency_ms=12, forward_ms=1, gap_ms=2500)
    assert plant.wait_ms == pytest.approx(5.0)


def test_batches_from_before_an_idle_spell_do_not_count() -> None:
    plant = Plant(controller(initial_ms=15))
    plant.run(batches=5, arrivals=20, latency_ms=20, forward_ms=5, full=True)
    assert plant.wait_ms == pytest.approx(15.0)
    # Ten seconds later one lone request: the heavy batches before the pause are not what the load is now.
    plant.run(batches=1, arrivals=1, latency_ms=17, forward_ms=1, gap_ms=10_000)
    assert plant.wait_ms == pytest.approx(7.5)


def test_without_a_target_it_derives_one_from_the_forward_time() -> None:
    policy = controller(target_ms=0)
    plant = Plant(policy)
    plant.run(batches=8, arrivals=1, latency_ms=12, forward_ms=30)
    assert policy.target_p50_s == pytest.approx(0.015 + 2 * 0.030)


def closed_loop(plant: Plant, rate_per_ms: float, periods: int) -> list[float]:
    """A device whose batches gather what arrived during the wait and the previous pass (`rate_per_ms` x both) and
    take 1 ms + 0.2 ms per item; the wait after each period."""
    waits = []
    forward = 1.0
    for _ in range(periods):
        arrivals = max(1, round(rate_per_ms * (plant.wait_ms + forward)))
        forward = 1 + 0.2 * arrivals
        plant.run(batches=8, arrivals=arrivals, latency_ms=plant.wait_ms + forward, forward_ms=forward, full=arrivals >= 64)
        waits.append(plant.wait_ms)
    return waits


def reversals(values: list[float]) -> int:
    steps = [b - a for a, b in zip(values, values[1:]) if b != a]
    return sum(1 for a, b in zip(steps, steps[1:]) if (a > 0) != (b > 0))


def test_a_step_from_light_to_heavy_load_and_back_moves_the_wait_one_way_each_time() -> None:
    plant = Plant(controller(target_ms=50))
    light = closed_loop(plant, rate_per_ms=0.02, periods=10)
    heavy = closed_loop(plant, rate_per_ms=2, periods=15)
    back = closed_loop(plant, rate_per_ms=0.02, periods=10)
    assert light[-1] == 0.0 and reversals(light) == 0
    assert heavy[-1] == pytest.approx(15.0) and reversals(heavy) == 0
    assert back[-1] == 0.0 and reversals(back) == 0


def test_when_heavy_load_meets_the_target_it_settles_instead_of_oscillating() -> None:
    plant = Plant(controller(target_ms=10))
    waits = closed_loop(plant, rate_per_ms=2, periods=40)
    settled = waits[-20:]
    assert len(set(settled)) == 1
    assert 2.0 < settled[0] < 15.0
    # The closed loop's p50 there (the wait plus the forward pass) is inside the band around 10 ms.
    assert 8.0 <= plant.last_latency_ms <= 12.0


def test_profiles_can_switch_adaptation_off() -> None:
    config = parse_model_config(
        {
            "id": "m",
            "path": "/weights",
            "profiles": {
                "default": {"adapter": "sentence_transformer", "max_batch_tokens": 4096},
                "fixed": {"extends": "default", "adaptive_batching": False},
                "fixed-short": {"extends": "fixed", "max_batch_tokens": 1024},
            },
        },
        source="m.yaml",
    )
    settings = WorkerSettings(max_batch_wait_ms=7)
    adaptive = batching_for(settings, config.profile("default"))
    assert isinstance(adaptive, AdaptiveBatching) and adaptive.current().max_tokens == 4096
    assert adaptive.current().max_wait_s == pytest.approx(0.007)
    fixed = batching_for(settings, config.profile("fixed-short"))
    assert fixed == FixedBatching(BatchLimits(64, 1024, 0.007))
    assert config.to_dict()["profiles"]["fixed"]["adaptive_batching"] is False
    # SIE_ADAPTIVE_BATCHING=false covers the profiles that do not say; one that says true keeps its controller.
    worker_off = WorkerSettings(adaptive_batching=False)
    assert isinstance(batching_for(worker_off, config.profile("default")), FixedBatching)
    assert isinstance(batching_for(worker_off, Profile(adapter="a", adaptive_batching=True)), AdaptiveBatching)


def test_adaptive_batching_must_be_a_boolean() -> None:
    with pytest.raises(ModelConfigError, match=r"profiles.default.adaptive_batching: must be true or false, got 'no'"):
        parse_model_config({"id": "m", "path": "/w", "profiles": {"default": {"adapter": "a", "adaptive_batching": "no"}}}, source="m.yaml")


def test_wait_bounds_and_target_are_checked_at_start() -> None:
    with pytest.raises(SettingsError, match="SIE_ADAPTIVE_MIN_QUANTUM_MS=20.0 and SIE_ADAPTIVE_MAX_QUANTUM_MS=15.0"):
        load_settings(WorkerSettings, environ={"SIE_ADAPTIVE_MIN_QUANTUM_MS": "20"})
    with pytest.raises(SettingsError, match="SIE_ADAPTIVE_TARGET_P50_MS=-1.0"):
        load_settings(WorkerSettings, environ={"SIE_ADAPTIVE_TARGET_P50_MS": "-1"})


async def test_batch_statistics_reach_the_default_registry() -> None:
    future = asyncio.get_running_loop().create_future()
    items = [PendingItem("k", cost, None, future, enqueued_at=10.0 + index) for index, cost in enumerate((3, 5))]
    policy = controller()
    batch = Batch(items, limits=policy.current(), full=False, formed_at=11.5)
    stats = describe(7, batch, policy, started=12.0, finished=12.25)
    assert (stats.items, stats.arrivals, stats.tokens, stats.padded_tokens) == (2, 2, 8, 10)
    assert stats.padding_fraction == pytest.approx(0.2)
    assert (stats.wait_ms, stats.staged_ms, stats.inference_ms) == pytest.approx((1500, 500, 250))
    labels = {"model": "test/stats", "profile": "default"}
    unknown = {"model": "(unknown)", "profile": "(unknown)"}
    before = REGISTRY.get_sample_value("sie_worker_batch_padding_fraction_count", labels) or 0
    before_unknown = REGISTRY.get_sample_value("sie_worker_batch_padding_fraction_count", unknown) or 0
    # Labels come from closed sets: a model the worker does not serve is recorded as "(unknown)".
    record("test/stats", "default", stats)
    assert REGISTRY.get_sample_value("sie_worker_batch_padding_fraction_count", labels) is None
    assert REGISTRY.get_sample_value("sie_worker_batch_padding_fraction_count", unknown) == before_unknown + 1
    MODELS.follow({"test/stats"}.__contains__)
    PROFILES.follow({"default"}.__contains__)
    try:
        record("test/stats", "default", stats)
        publish_setting("test/stats", "default", policy)
    finally:
        MODELS.follow(frozenset().__contains__)
        PROFILES.follow(frozenset().__contains__)
    assert REGISTRY.get_sample_value("sie_worker_batch_padding_fraction_count", labels) == before + 1
    assert REGISTRY.get_sample_value("sie_worker_batch_wait_seconds_sum", labels) >= 1.5
    assert REGISTRY.get_sample_value("sie_worker_batches_total", {**labels, "flush": "wait"}) >= 1
    assert REGISTRY.get_sample_value("sie_worker_batch_wait_setting_seconds", labels) == pytest.approx(0.010)
    assert REGISTRY.get_sample_value("sie_worker_batch_budget_tokens", labels) == MAX_TOKENS
    assert REGISTRY.get_sample_value("sie_worker_batch_target_p50_seconds", labels) == pytest.approx(0.050)


def test_the_switch_survives_the_config_service_messages() -> None:
    data = {"id": "m", "path": "/w", "profiles": {"default": {"adapter": "a"}, "fixed": {"extends": "default", "adaptive_batching": False}}}
    message = config_to_message(parse_model_config(data, source="m.yaml"))
    assert message.profiles["fixed"].HasField("adaptive_batching") and not message.profiles["default"].HasField("adaptive_batching")
    again = config_from_message(message, source="etcd")
    assert again.profile("fixed").adaptive_batching is False and again.profile("default").adaptive_batching is None
