"""The gateway's in-memory mirror of etcd: model configs, bundles, workers, pools.

Four PrefixMirrors keep it current (full read, then watch; resume or re-read
after a disconnect or compaction), so routing reads plain dicts. Models and
bundles are applied one changed key at a time (a model change decodes that
one config and moves the bundle hashes by its digest), so a control plane of
thousands of models costs the same per change as one of ten; only a full read
decodes everything.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping

from sie_common.cluster import cluster_store, config_store
from sie_common.cluster.bundles import Bundle, BundleHashes
from sie_common.cluster.cluster_store import PoolRecord, WorkerRecord
from sie_common.cluster.etcd import Etcd
from sie_common.cluster.etcd_mirror import MirrorUpdate, PrefixMirror
from sie_common.cluster.model_config import ModelConfig

log = logging.getLogger(__name__)

# Called with every worker's record (worker id -> record) after any registration or pool changed.
WorkersChanged = Callable[[Mapping[str, WorkerRecord]], Awaitable[None]]


class ClusterView:
    def __init__(self, etcd: Etcd, on_workers_changed: WorkersChanged | None = None) -> None:
        self._on_workers_changed = on_workers_changed
        self._models = PrefixMirror(etcd, config_store.MODELS, self._models_changed)
        self._bundles = PrefixMirror(etcd, config_store.BUNDLES, self._bundles_changed)
        self._workers = PrefixMirror(etcd, cluster_store.WORKERS, self._membership_changed)
        self._pools = PrefixMirror(etcd, cluster_store.POOLS, self._membership_changed)
        self.models: dict[str, ModelConfig] = {}
        self.bundles: dict[str, Bundle] = {}
        # Bundle id -> the bundle config hash a caught-up worker of it reports.
        self.expected_hashes: dict[str, str] = {}
        self.pools: dict[str, PoolRecord] = {}
        # Each worker with `pool` set to the resource pool it serves (its own SIE_POOL, or an assignment).
        self.workers: dict[str, WorkerRecord] = {}
        self.synced = False
        self._hashes = BundleHashes()
        # Model and bundle values decoded so far: one per changed key, all of them per full read.
        self.config_entries_decoded = 0

    async def start(self) -> None:
        for mirror in (self._models, self._bundles, self._pools, self._workers):
            await mirror.start()
        self.synced = True

    async def stop(self) -> None:
        for mirror in (self._models, self._bundles, self._pools, self._workers):
            await mirror.stop()

    def bundles_for(self, config: ModelConfig) -> list[str]:
        """Bundles that can serve `config`, highest priority first."""
        serving = [bundle for bundle in self.bundles.values() if bundle.can_serve(config)]
        return [bundle.id for bundle in sorted(serving, key=lambda b: (-b.priority, b.id))]

    def _models_changed(self, update: MirrorUpdate) -> None:
        if update.full_read:
            self.models = config_store.decode_models(update.state)
            self.config_entries_decoded += len(update.state)
            self._hashes = BundleHashes()
            for bundle in self.bundles.values():
                self._hashes.put_bundle(bundle)
            for model in self.models.values():
                self._hashes.put_model(model)
        for change in update.changes:
            config = (
                None
                if change.value is None
                else config_store.decode_models({change.name: change.value}).get(change.name)
            )
            self.config_entries_decoded += change.value is not None
            if config is None:
                self.models.pop(change.name, None)
                self._hashes.remove_model(change.name)
            else:
                self.models[change.name] = config
                self._hashes.put_model(config)
        self.expected_hashes = self._hashes.hashes()

    def _bundles_changed(self, update: MirrorUpdate) -> None:
        before, self.bundles = self.bundles, config_store.decode_bundles(update.state)
        self.config_entries_decoded += len(update.state)
        for bundle_id in set(before) - set(self.bundles):
            self._hashes.remove_bundle(bundle_id)
        for bundle in self.bundles.values():
            if before.get(bundle.id) != bundle:
                self._hashes.put_bundle(bundle)
        self.expected_hashes = self._hashes.hashes()

    async def _membership_changed(self, update: MirrorUpdate) -> None:
        self.pools = cluster_store.decode_all(self._pools.state, cluster_store.decode_pool)
        assigned = {worker: pool.name for pool in self.pools.values() for worker in pool.workers}
        records = cluster_store.decode_all(self._workers.state, cluster_store.decode_worker)
        self.workers = {
            record.worker_id: dataclasses.replace(record, pool=record.pool or assigned.get(record.worker_id, ""))
            for record in records.values()
        }
        if self._on_workers_changed is not None:
            await self._on_workers_changed(self.workers)
