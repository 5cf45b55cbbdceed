"""Prometheus metrics whose label values come only from closed sets.

Every series a label value opens lives until the process restarts, so a value
that a caller or a config can choose freely (a made-up model name, a 500 KB
string) would grow `/metrics` and the process without bound. Every labelled
metric of the engine is built here: each label names a ClosedSet, and a value
outside its set is recorded as UNKNOWN, whoever passes it. A set is either
fixed (an enum: operations, gRPC status codes) or follows what the service
knows now (the models it serves, read through a callable bound at start).
tests/reliability/test_metric_labels.py holds that no other module builds a
labelled metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

import grpc
from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

# What a label value outside its closed set is recorded as.
UNKNOWN = "(unknown)"
# Longer values are UNKNOWN whatever the set says: a member is a configured id or an enum name, never longer.
MAX_LABEL_CHARS = 256


class ClosedSet:
    """The values one label may take: `members`, or what `follow`'s callable accepts once bound."""

    def __init__(self, members: Iterable[str] = ()) -> None:
        self._contains: Callable[[str], bool] = frozenset(members).__contains__

    def follow(self, contains: Callable[[str], bool]) -> None:
        """From now on the members are the values `contains` accepts, asked at record time (e.g. the models this
        service serves now); it must be cheap and safe to call from any thread."""
        self._contains = contains

    def admit(self, value: str) -> str:
        """`value` if it is a member, else UNKNOWN."""
        return value if len(value) <= MAX_LABEL_CHARS and self._contains(value) else UNKNOWN


STATUS_CODES = ClosedSet(code.name for code in grpc.StatusCode)

M = TypeVar("M", Counter, Gauge, Histogram)


class Closed(Generic[M]):
    """A labelled metric whose `labels()` maps each value through its label's closed set."""

    def __init__(self, metric: M, sets: Sequence[ClosedSet]) -> None:
        self._metric: M = metric
        self._sets = tuple(sets)

    def labels(self, *values: str) -> M:
        return self._metric.labels(*(s.admit(v) for s, v in zip(self._sets, values, strict=True)))


def counter(name: str, documentation: str, labels: Mapping[str, ClosedSet]) -> Closed[Counter]:
    return Closed(Counter(name, documentation, list(labels)), list(labels.values()))


def gauge(name: str, documentation: str, labels: Mapping[str, ClosedSet]) -> Closed[Gauge]:
    return Closed(Gauge(name, documentation, list(labels)), list(labels.values()))


def histogram(
    name: str, documentation: str, labels: Mapping[str, ClosedSet], buckets: Sequence[float]
) -> Closed[Histogram]:
    return Closed(Histogram(name, documentation, list(labels), buckets=buckets), list(labels.values()))


class ClosedFamily:
    """A labelled metric read at scrape time (in a Collector): samples whose values map to the same labels add up."""

    def __init__(
        self,
        kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
        name: str,
        documentation: str,
        labels: Mapping[str, ClosedSet],
    ) -> None:
        self._family = kind(name, documentation, labels=list(labels))
        self._sets = tuple(labels.values())
        self._values: dict[tuple[str, ...], float] = {}

    def add(self, values: Sequence[str], value: float) -> None:
        key = tuple(s.admit(v) for s, v in zip(self._sets, values, strict=True))
        self._values[key] = self._values.get(key, 0.0) + value

    def metric(self) -> Metric:
        for key, value in sorted(self._values.items()):
            self._family.add_metric(list(key), value)
        return self._family
