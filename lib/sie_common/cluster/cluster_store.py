"""Runtime cluster state in etcd: worker registrations, resource pools, scale-from-zero demand.

Keys are names under the etcd prefix (docs/control-plane.md has the layout);
values are JSON. Workers write `workers/<id>` under their own lease, so a dead
worker's key disappears with it; pools live under theirs, so an unrenewed pool
expires by itself; demand records carry a short lease and vanish when demand stops.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TypeVar

log = logging.getLogger(__name__)

WORKERS = "workers/"
POOLS = "pools/"
DEMAND = "demand/"


@dataclass(frozen=True)
class WorkerRecord:
    """What a worker publishes about itself (and what the gateway routes on)."""

    worker_id: str
    address: str
    bundle: str
    machine_profile: str
    # A worker started with SIE_POOL serves only that resource pool; "" means shared.
    pool: str = ""
    gpu_count: int = 1
    loaded_models: frozenset[str] = field(default_factory=frozenset)
    queue_depth: int = 0
    free_capacity: int = 0
    bundle_config_hash: str = ""
    ready: bool = True


@dataclass(frozen=True)
class PoolRecord:
    """A resource pool: workers reserved for one tenant, per machine profile, under a lease."""

    name: str
    gpus: Mapping[str, int]
    ttl_s: int
    lease: int
    workers: tuple[str, ...] = ()
    expires_at: float = 0.0
    # Whose quota it counts against: a digest of the creator's bearer token ("" without one).
    owner: str = ""
    # Only workers of this bundle are assigned ("" : any bundle).
    bundle: str = ""
    # When it was created (Unix seconds): no renewal carries it past the gateway's SIE_POOL_MAX_LIFETIME_S from here.
    created_at: float = 0.0

    def ready(self, profile_of: Mapping[str, str]) -> bool:
        """Every requested worker is assigned (profile_of: worker id -> machine profile)."""
        for profile, count in self.gpus.items():
            if sum(1 for worker in self.workers if profile_of.get(worker) == profile) < count:
                return False
        return True


def encode_worker(record: WorkerRecord) -> bytes:
    data = asdict(record)
    data["loaded_models"] = sorted(record.loaded_models)
    return json.dumps(data, sort_keys=True).encode()


def decode_worker(value: bytes) -> WorkerRecord:
    data = json.loads(value)
    data["loaded_models"] = frozenset(data.get("loaded_models", ()))
    return WorkerRecord(**data)


def encode_pool(record: PoolRecord) -> bytes:
    data = asdict(record)
    data["gpus"] = dict(record.gpus)
    data["workers"] = list(record.workers)
    return json.dumps(data, sort_keys=True).encode()


def decode_pool(value: bytes) -> PoolRecord:
    data = json.loads(value)
    data["workers"] = tuple(data.get("workers", ()))
    return PoolRecord(**data)


Record = TypeVar("Record")


def decode_all(values: Mapping[str, bytes], decode: Callable[[bytes], Record]) -> dict[str, Record]:
    """name -> record for every value that decodes; others are logged and left out."""
    records: dict[str, Record] = {}
    for name, value in values.items():
        try:
            records[name] = decode(value)
        except (ValueError, TypeError, KeyError) as error:
            log.error("ignoring unreadable record %s: %s", name, error)
    return records
