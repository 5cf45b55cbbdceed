"""Serve the model configs the config service writes to etcd for this worker's bundle, live.

Two etcd mirrors (bundles and models) follow the control plane; on every
model change the worker adds that config, if its bundle (SIE_BUNDLE) can
serve it, to its registry, so a model added through the config service
becomes servable without a restart; each change costs the same however many
models etcd holds. The bundle config hash it computes is the one the config
service reports for the bundle once the worker has caught up.
"""

from __future__ import annotations

import logging

from sie_common.cluster import config_store
from sie_common.cluster.bundles import Bundle, BundleHashes
from sie_common.cluster.etcd import Etcd
from sie_common.cluster.etcd_mirror import MirrorUpdate, PrefixMirror
from sie_common.cluster.model_config import ModelConfig
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class ConfigSync:
    def __init__(self, settings: WorkerSettings, registry: ModelRegistry, etcd: Etcd) -> None:
        self._settings = settings
        self._registry = registry
        self._etcd = etcd
        self._bundles = PrefixMirror(self._etcd, config_store.BUNDLES, self._bundles_changed)
        self._models = PrefixMirror(self._etcd, config_store.MODELS, self._models_changed)
        self._bundle: Bundle | None = None
        # Every model config in etcd, decoded once per change (kept to re-filter when the bundle changes).
        self._configs: dict[str, ModelConfig] = {}
        self._hashes = BundleHashes()
        self.bundle_config_hash: str | None = None

    async def start(self) -> None:
        """Apply everything etcd holds now; later changes apply as they come."""
        await self._bundles.start()
        await self._models.start()

    async def stop(self) -> None:
        await self._models.stop()
        await self._bundles.stop()

    def _bundles_changed(self, update: MirrorUpdate) -> None:
        bundle = config_store.decode_bundles(update.state).get(self._settings.bundle)
        if bundle is None:
            log.warning("bundle %r is not in etcd yet; no etcd model configs served", self._settings.bundle)
        if bundle == self._bundle:
            return
        self._bundle = bundle
        self._hashes = BundleHashes()
        if bundle is not None:
            self._hashes.put_bundle(bundle)
            served = [config for config in self._configs.values() if self._serves(config)]
            self._registry.add_configs(served)
            for config in served:
                self._hashes.put_model(config)
        self._report(update.revision)

    def _models_changed(self, update: MirrorUpdate) -> None:
        """Apply only the changed keys (all of them after a full read): O(1) per change."""
        if update.full_read:
            self._configs = config_store.decode_models(update.state)
            self._hashes = BundleHashes()
            if self._bundle is not None:
                self._hashes.put_bundle(self._bundle)
            changed = list(self._configs)
        else:
            changed = [change.name for change in update.changes]
            for change in update.changes:
                config = (
                    None
                    if change.value is None
                    else config_store.decode_models({change.name: change.value}).get(change.name)
                )
                if config is None:
                    self._configs.pop(change.name, None)
                else:
                    self._configs[change.name] = config
        for model_id in changed:
            config = self._configs.get(model_id)
            if config is not None and self._serves(config):
                self._registry.add_configs([config])
                self._hashes.put_model(config)
            else:
                self._hashes.remove_model(model_id)
        self._report(update.revision)

    def _serves(self, config: ModelConfig) -> bool:
        if self._bundle is None or not self._bundle.can_serve(config):
            return False
        return not self._settings.model_filter or config.id in self._settings.model_filter

    def _report(self, revision: int) -> None:
        bundle = self._bundle
        config_hash = self._hashes.hash(bundle.id) if bundle is not None else None
        if bundle is not None and config_hash is not None and config_hash != self.bundle_config_hash:
            self.bundle_config_hash = config_hash
            log.info("bundle %s config hash %s at etcd revision %d", bundle.id, config_hash, revision)
