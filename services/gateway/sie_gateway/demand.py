"""Scale-from-zero demand: what an autoscaler reads to start workers of a machine profile.

Each request that finds no worker of a configured profile counts here and is
published to etcd as `demand/<profile>` (JSON: profile, pool, requests in the
current window, last_request_at), under a short lease so the key disappears
once requests stop. Writes are throttled to one per profile per second.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter

from sie_common.cluster_store import DEMAND
from sie_common.etcd import Etcd, EtcdUnavailable

log = logging.getLogger(__name__)

DEMAND_TTL_S = 30
_PUBLISH_EVERY_S = 1.0


class DemandRecorder:
    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd
        self.requests: Counter[tuple[str, str]] = Counter()  # (profile, pool) -> requests since start
        self._published_at: dict[tuple[str, str], float] = {}

    async def record(self, profile: str, pool: str) -> None:
        key = (profile, pool)
        self.requests[key] += 1
        now = time.monotonic()
        if now - self._published_at.get(key, 0.0) < _PUBLISH_EVERY_S:
            return
        self._published_at[key] = now
        value = {"machine_profile": profile, "pool": pool, "requests": self.requests[key], "last_request_at": time.time()}
        name = DEMAND + (profile or "default") + (f"@{pool}" if pool else "")
        try:
            lease = await self._etcd.grant_lease(DEMAND_TTL_S)
            await self._etcd.put(name, json.dumps(value, sort_keys=True).encode(), lease=lease)
        except EtcdUnavailable as error:
            log.warning("could not publish demand for %s: %s", name, error)
