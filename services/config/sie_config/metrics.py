"""The config service's Prometheus metrics, served on SIE_CONFIG_METRICS_PORT (docs/observability.md).

Requests are labelled by RPC name (the ConfigService's methods); the `model`
label is always empty."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sie.v1 import config_pb2
from sie_common.edge.request_metrics import RequestMetrics
from sie_common.runtime.metric_labels import ClosedSet
from sie_config.leader import LeaderElection

RPCS = ClosedSet(config_pb2.DESCRIPTOR.services_by_name["ConfigService"].methods_by_name)
REQUESTS = RequestMetrics("config", ClosedSet([""]), RPCS)


class ElectionCollector(Collector):
    """Read at scrape time: whether this replica is the single writer."""

    def __init__(self, election: LeaderElection) -> None:
        self._election = election

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "sie_config_leader",
            "1 while this replica holds the leader key (the single writer), else 0",
            value=int(self._election.is_leader),
        )


def register_election(election: LeaderElection) -> None:
    REGISTRY.register(ElectionCollector(election))
