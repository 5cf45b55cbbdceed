"""The worker's Prometheus metrics, served on SIE_WORKER_METRICS_PORT (docs/observability.md).

Request metrics are recorded once per answered request (unary, EncodeStream or
Work stream alike; sie_common.edge.request_metrics); batch metrics once per forward
pass; requests in flight, loaded models and memory are read from the engine
when Prometheus scrapes. Labels come from closed sets: the models and profiles
this worker serves (followed from its registry once `register_engine` runs),
the three operations; any other value is "(unknown)".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

import torch
from prometheus_client import REGISTRY, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sie_common.cluster.model_config import TASKS
from sie_common.edge.request_metrics import RequestMetrics
from sie_common.runtime.metric_labels import ClosedFamily, ClosedSet, histogram
from sie_common.runtime.metrics_server import LATENCY_BUCKETS_S

T = TypeVar("T")

# The models and profiles this worker serves (bound by register_engine), and its operations.
MODELS = ClosedSet()
PROFILES = ClosedSet()
OPERATIONS = ClosedSet(TASKS)
MODEL_PROFILE = {"model": MODELS, "profile": PROFILES}

REQUESTS = RequestMetrics("worker", MODELS, OPERATIONS)
QUEUE_SECONDS = histogram(
    "sie_worker_queue_duration_seconds",
    "Time a successful request's items waited in the BatchFormer for a forward pass (its longest-waiting item)",
    {"model": MODELS, "operation": OPERATIONS},
    LATENCY_BUCKETS_S,
)
INFERENCE_SECONDS = histogram(
    "sie_worker_inference_duration_seconds", "Duration of one forward pass", {"model": MODELS}, LATENCY_BUCKETS_S
)
# Recorded for every forward pass; sie_worker.batching.stats adds the batcher's setting and, with SIE_INSTRUMENTATION,
# padding and wait.
BATCH_ITEMS = histogram(
    "sie_worker_batch_items", "Items per forward pass.", MODEL_PROFILE, tuple(float(2**p) for p in range(10))
)
BATCH_TOKENS = histogram(
    "sie_worker_batch_tokens",
    "Tokens per forward pass, before padding.",
    MODEL_PROFILE,
    tuple(float(2**p) for p in range(17)),
)
QUEUE_DEPTH = Gauge("sie_worker_queue_depth", "Items waiting in the BatchFormer for a forward pass")
# A gateway keeps one Work stream per worker: more than one per gateway means streams broke and were reopened.
WORK_STREAMS = Counter("sie_worker_work_streams", "Work streams opened by gateways")


def record_batch(model: str, profile: str, items: int, tokens: int, inference_s: float) -> None:
    BATCH_ITEMS.labels(model, profile).observe(items)
    BATCH_TOKENS.labels(model, profile).observe(tokens)
    INFERENCE_SECONDS.labels(model).observe(inference_s)


class LoadedModels(Protocol):
    """What the collector reads of the model registry."""

    @property
    def loaded_model_ids(self) -> frozenset[str]: ...

    def serves(self, model_id: str) -> bool: ...

    def serves_profile(self, profile: str) -> bool: ...

    @property
    def loaded_bytes(self) -> int: ...


class Served(Protocol):
    """What the collector reads of the engine (sie_worker.engine.engine.Engine)."""

    @property
    def in_flight(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def registry(self) -> LoadedModels: ...


class EngineCollector(Collector):
    """Read at scrape time: requests in flight, loaded models, their weight bytes and CUDA device memory."""

    def __init__(self, engine: Served) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        registry = self._engine.registry
        model_ids, weight_bytes = _read_while_still(lambda: (sorted(registry.loaded_model_ids), registry.loaded_bytes))
        yield GaugeMetricFamily(
            "sie_worker_requests_in_flight", "Requests admitted and not yet answered", value=self._engine.in_flight
        )
        loaded = ClosedFamily(
            GaugeMetricFamily, "sie_worker_model_loaded", "1 for each model loaded on the device", {"model": MODELS}
        )
        for model_id in model_ids:
            loaded.add([model_id], 1)
        yield loaded.metric()
        yield GaugeMetricFamily(
            "sie_worker_model_memory_bytes",
            "Bytes of the loaded models' weights (parameters and buffers)",
            value=weight_bytes,
        )
        device = self._engine.device
        if device.type == "cuda":
            free, total = torch.cuda.mem_get_info(device)
            memory = ClosedFamily(
                GaugeMetricFamily,
                "sie_worker_device_memory_bytes",
                "CUDA device memory, used (all processes) and total",
                {"device": ClosedSet([str(device)]), "state": ClosedSet(["used", "total"])},
            )
            memory.add([str(device), "used"], total - free)
            memory.add([str(device), "total"], total)
            yield memory.metric()


def _read_while_still(read: Callable[[], T]) -> T:
    """`read()` from the scrape thread; a model loading at that moment changes the registry's dicts
    under the iteration (RuntimeError), so read again."""
    for _ in range(9):
        try:
            return read()
        except RuntimeError:
            continue
    return read()


def register_engine(engine: Served) -> None:
    """Collect from `engine`, and label by the models and profiles its registry serves."""
    MODELS.follow(engine.registry.serves)
    PROFILES.follow(engine.registry.serves_profile)
    REGISTRY.register(EngineCollector(engine))
