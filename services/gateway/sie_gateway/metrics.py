"""The gateway's Prometheus metrics, served on SIE_GATEWAY_METRICS_PORT (docs/observability.md).

Requests are counted per model, operation and status (sie_common.edge.request_metrics);
the demand gauge KEDA scales workers on, requests in flight and registered
workers are read when Prometheus scrapes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sie_common.edge.request_metrics import RequestMetrics
from sie_gateway.cluster_view import ClusterView
from sie_gateway.demand import DemandRecorder

REQUESTS = RequestMetrics("gateway")


class GatewayCollector(Collector):
    def __init__(self, in_flight: Callable[[], int], demand: DemandRecorder, view: ClusterView) -> None:
        self._in_flight = in_flight
        self._demand = demand
        self._view = view

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "sie_gateway_requests_in_flight",
            "Inference requests admitted by this gateway and not yet answered",
            value=self._in_flight(),
        )
        demand = GaugeMetricFamily(
            "sie_gateway_demand",
            "Requests in flight to workers of a machine profile and pool, plus requests that found no such worker in "
            "the last 30 s",
            labels=["machine_profile", "pool"],
        )
        for (profile, pool), value in sorted(self._demand.demand().items()):
            demand.add_metric([profile, pool], value)
        yield demand
        workers = GaugeMetricFamily(
            "sie_gateway_workers", "Ready workers in the gateway's etcd mirror", labels=["machine_profile", "pool"]
        )
        ready = Counter(
            (worker.machine_profile, worker.pool) for worker in list(self._view.workers.values()) if worker.ready
        )
        for (profile, pool), count in sorted(ready.items()):
            workers.add_metric([profile, pool], count)
        yield workers
        yield CounterMetricFamily(
            "sie_gateway_config_entries_decoded",
            "Model and bundle values decoded from etcd: one per changed key, every key on a full read",
            value=self._view.config_entries_decoded,
        )


def register_gateway(in_flight: Callable[[], int], demand: DemandRecorder, view: ClusterView) -> None:
    REGISTRY.register(GatewayCollector(in_flight, demand, view))
