"""Scale-from-zero demand: what an autoscaler reads to start workers of a machine profile.

Each request that finds no worker of a configured profile counts here and is
published to etcd as `demand/<profile>` (JSON: profile, pool, requests in the
current window, last_request_at), under a short lease so the key disappears
once requests stop. Writes are throttled to one per profile per second.

The same demand is the Prometheus gauge `sie_gateway_demand{machine_profile,pool}`
(KEDA scales a profile's workers on it): requests in flight to workers of the
profile plus requests that found none within the last DEMAND_TTL_S seconds.
A request without a profile header counts as profile `default`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator

from sie_common.cluster.cluster_store import DEMAND
from sie_common.cluster.etcd import Etcd, EtcdUnavailable

log = logging.getLogger(__name__)

DEMAND_TTL_S = 30
DEFAULT_PROFILE = "default"
_PUBLISH_EVERY_S = 1.0

Key = tuple[str, str]  # (machine profile, pool)


class DemandRecorder:
    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd
        self.requests: Counter[Key] = Counter()  # (profile, pool) -> requests since start that found no worker
        self._published_at: dict[Key, float] = {}
        # The gauge is read from the metrics thread: these three change under the lock.
        self._lock = threading.Lock()
        self._in_flight: Counter[Key] = Counter()
        self._unserved: dict[Key, deque[float]] = {}

    async def record(self, profile: str, pool: str) -> None:
        """A request found no worker of `profile` in `pool`."""
        key = (profile, pool)
        self.requests[key] += 1
        now = time.monotonic()
        with self._lock:
            self._unserved.setdefault((profile or DEFAULT_PROFILE, pool), deque()).append(now)
        if now - self._published_at.get(key, 0.0) < _PUBLISH_EVERY_S:
            return
        self._published_at[key] = now
        value = {
            "machine_profile": profile,
            "pool": pool,
            "requests": self.requests[key],
            "last_request_at": time.time(),
        }
        name = DEMAND + (profile or DEFAULT_PROFILE) + (f"@{pool}" if pool else "")
        try:
            lease = await self._etcd.grant_lease(DEMAND_TTL_S)
            await self._etcd.put(name, json.dumps(value, sort_keys=True).encode(), lease=lease)
        except EtcdUnavailable as error:
            log.warning("could not publish demand for %s: %s", name, error)

    @contextlib.contextmanager
    def serving(self, profile: str, pool: str) -> Iterator[None]:
        """A request in flight to a worker of `profile` in `pool` for the duration of the block."""
        key = (profile or DEFAULT_PROFILE, pool)
        with self._lock:
            self._in_flight[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[key] -= 1

    def demand(self) -> dict[Key, int]:
        """(profile, pool) -> requests in flight plus requests unserved in the window; every key seen since start."""
        horizon = time.monotonic() - DEMAND_TTL_S
        with self._lock:
            for times in self._unserved.values():
                while times and times[0] < horizon:
                    times.popleft()
            keys = set(self._in_flight) | set(self._unserved)
            return {key: self._in_flight[key] + len(self._unserved.get(key, ())) for key in keys}
