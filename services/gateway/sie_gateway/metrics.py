"""The gateway's Prometheus metrics, served on SIE_GATEWAY_METRICS_PORT (docs/observability.md).

Requests are counted per model, operation and status (sie_common.edge.request_metrics);
the demand gauge KEDA scales workers on, requests in flight and registered
workers are read when Prometheus scrapes. Labels come from closed sets: the
models configured in etcd, the machine profiles configured or registered, the
pools that exist; any other value is "(unknown)".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sie_common.cluster.model_config import TASKS
from sie_common.edge.request_metrics import RequestMetrics
from sie_common.runtime.metric_labels import ClosedFamily, ClosedSet
from sie_gateway.cluster_view import ClusterView
from sie_gateway.demand import DEFAULT_PROFILE, DemandRecorder

# The models configured in etcd (bound by register_gateway).
MODELS = ClosedSet()
REQUESTS = RequestMetrics("gateway", MODELS, ClosedSet(TASKS))


class GatewayCollector(Collector):
    def __init__(
        self,
        in_flight: Callable[[], int],
        demand: DemandRecorder,
        view: ClusterView,
        configured_profiles: Iterable[str],
    ) -> None:
        self._in_flight = in_flight
        self._demand = demand
        self._view = view
        self._configured_profiles = frozenset(configured_profiles) | {DEFAULT_PROFILE}

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "sie_gateway_requests_in_flight",
            "Inference requests admitted by this gateway and not yet answered",
            value=self._in_flight(),
        )
        registered = list(self._view.workers.values())
        labels = {
            "machine_profile": ClosedSet(self._configured_profiles | {worker.machine_profile for worker in registered}),
            "pool": ClosedSet({"", *self._view.pools, *(worker.pool for worker in registered)}),
        }
        demand = ClosedFamily(
            GaugeMetricFamily,
            "sie_gateway_demand",
            "Requests in flight to workers of a machine profile and pool, plus requests that found no such worker in "
            "the last 30 s",
            labels,
        )
        for (profile, pool), value in self._demand.demand().items():
            demand.add([profile, pool], value)
        yield demand.metric()
        workers = ClosedFamily(
            GaugeMetricFamily, "sie_gateway_workers", "Ready workers in the gateway's etcd mirror", labels
        )
        for worker in registered:
            if worker.ready:
                workers.add([worker.machine_profile, worker.pool], 1)
        yield workers.metric()
        yield CounterMetricFamily(
            "sie_gateway_config_entries_decoded",
            "Model and bundle values decoded from etcd: one per changed key, every key on a full read",
            value=self._view.config_entries_decoded,
        )


def register_gateway(
    in_flight: Callable[[], int], demand: DemandRecorder, view: ClusterView, configured_profiles: Iterable[str]
) -> None:
    """Collect from these, and label requests by the models `view` holds."""
    MODELS.follow(lambda model: model in view.models)
    REGISTRY.register(GatewayCollector(in_flight, demand, view, configured_profiles))
