"""Serve the model configs the config service writes to etcd for this worker's bundle, live.

Two etcd mirrors (bundles and models) follow the control plane; on every
update the worker adds the configs its bundle (SIE_BUNDLE) can serve to its
registry, so a model added through the config service becomes servable
without a restart. The bundle config hash it computes is the one the config
service reports for the bundle once the worker has caught up.
"""

from __future__ import annotations

import logging

from sie_common import config_store
from sie_common.bundles import bundle_config_hash
from sie_common.etcd import Etcd
from sie_common.etcd_mirror import MirrorUpdate, PrefixMirror
from sie_worker.registry import ModelRegistry
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


class ConfigSync:
    def __init__(self, settings: WorkerSettings, registry: ModelRegistry) -> None:
        self._settings = settings
        self._registry = registry
        self._etcd = Etcd(settings.etcd_endpoints, settings.etcd_prefix)
        self._bundles = PrefixMirror(self._etcd, config_store.BUNDLES, self._refresh)
        self._models = PrefixMirror(self._etcd, config_store.MODELS, self._refresh)
        self.bundle_config_hash: str | None = None

    async def start(self) -> None:
        """Connect and apply everything etcd holds now; later changes apply as they come."""
        await self._etcd.connect()
        await self._bundles.start()
        await self._models.start()

    async def stop(self) -> None:
        await self._models.stop()
        await self._bundles.stop()
        await self._etcd.close()

    def _refresh(self, update: MirrorUpdate) -> None:
        bundle = config_store.decode_bundles(self._bundles.state).get(self._settings.bundle)
        if bundle is None:
            log.warning("bundle %r is not in etcd yet; no etcd model configs served", self._settings.bundle)
            return
        configs = [config for config in config_store.decode_models(self._models.state).values() if bundle.can_serve(config)]
        if self._settings.model_filter:
            configs = [config for config in configs if config.id in self._settings.model_filter]
        self._registry.add_configs(configs)
        config_hash = bundle_config_hash(bundle, configs)
        if config_hash != self.bundle_config_hash:
            self.bundle_config_hash = config_hash
            log.info(
                "bundle %s config hash %s at etcd revision %d (%d models from etcd)",
                bundle.id, config_hash, update.revision, len(configs),
            )
