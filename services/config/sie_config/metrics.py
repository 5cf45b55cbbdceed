"""The config service's Prometheus metrics, served on SIE_CONFIG_METRICS_PORT (docs/observability.md)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sie_common.edge.request_metrics import RequestMetrics
from sie_config.leader import LeaderElection

REQUESTS = RequestMetrics("config")


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
