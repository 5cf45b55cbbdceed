"""Which worker serves a request.

model -> bundles that can serve it -> live, ready workers of those bundles with
the requested machine profile and pool -> prefer workers that have the model
loaded, then the least outstanding work. A model loaded nowhere goes to one
worker chosen by rendezvous hashing on the model id, so a burst of first
requests loads it once, not on every worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence

from sie_common.cluster.cluster_store import WorkerRecord


def eligible_workers(
    workers: Sequence[WorkerRecord],
    *,
    bundles: Collection[str],
    machine_profile: str = "",
    pool: str = "",
    exclude: Collection[str] = (),
) -> list[WorkerRecord]:
    """Ready workers of the given bundles, profile and pool. Pool workers serve only their pool."""
    return [
        worker
        for worker in workers
        if worker.ready
        and worker.bundle in bundles
        and (not machine_profile or worker.machine_profile == machine_profile)
        and worker.pool == pool
        and worker.worker_id not in exclude
    ]


def choose_worker(
    candidates: Sequence[WorkerRecord], model: str, outstanding: Mapping[str, int]
) -> WorkerRecord | None:
    """The best candidate for `model`; `outstanding` is this gateway's in-flight count per worker."""
    if not candidates:
        return None
    warm = [worker for worker in candidates if model in worker.loaded_models]
    if warm:
        return min(warm, key=lambda w: (outstanding.get(w.worker_id, 0), w.queue_depth, w.worker_id))
    return max(candidates, key=lambda w: _rendezvous(model, w.worker_id))


def _rendezvous(model: str, worker_id: str) -> bytes:
    return hashlib.blake2b(f"{model}\0{worker_id}".encode(), digest_size=8).digest()
