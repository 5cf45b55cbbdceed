"""Find a model's weights: explicit path, local cache, cluster cache, then an origin.

    path  ->  SIE_LOCAL_CACHE  ->  SIE_CLUSTER_CACHE (copied to local)  ->  origin

The origin is the model's bundled package, else the Hugging Face Hub when
SIE_HF_FALLBACK is true. Weights fetched from an origin are uploaded to the
cluster cache so the next worker finds them there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError, RevisionNotFoundError

from sie_common.cluster.model_config import ModelConfig, weight_packages
from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import ClusterCache, LocalCache, local_cache_root, weights_key
from sie_worker.weights.roots import WeightRoots, bundled_directory, default_roots
from sie_worker.weights.s3 import S3Location, S3Store

log = logging.getLogger(__name__)

# The Hub's answers that another attempt does not change: no such repository (or none this worker may read: gated,
# private), no such revision, or an id or revision the Hub refuses to look up. Only a change to the config or the
# worker's token fixes them.
_HUB_MISSES = (RepositoryNotFoundError, RevisionNotFoundError, HFValidationError)


class WeightsNotFound(RuntimeError):
    """No source had the weights; the message lists what was tried.

    `retryable` is true when a source failed with an error (a network fault)
    rather than a plain miss, so trying again later may help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True)
class ResolvedWeights:
    path: Path
    source: str  # "path", "local cache", "cluster cache", "bundled package", "hub"


class WeightResolver:
    def __init__(self, settings: WorkerSettings, roots: WeightRoots | None = None) -> None:
        self.roots = roots or WeightRoots(default_roots(settings, ()))
        self._hf_cache = settings.local_cache
        self.local = LocalCache(
            local_cache_root(settings),
            lru_enabled=settings.disk_cache_enabled,
            pressure_percent=settings.disk_pressure_threshold_percent,
        )
        self.cluster = (
            ClusterCache(S3Store(settings.s3_endpoint_url), S3Location.parse(settings.cluster_cache))
            if settings.cluster_cache
            else None
        )
        self._hf_fallback = settings.hf_fallback
        self._weight_packages = weight_packages(settings.weight_packages)

    def resolve(self, config: ModelConfig, *, keep: frozenset[str] = frozenset()) -> ResolvedWeights:
        """The directory holding `config`'s weights. `keep`: cache keys the disk LRU must not remove."""
        key = weights_key(config)
        tried: list[str] = []
        retryable = False
        if config.path is not None:
            self.roots.check(config.path, model=config.id, what="path")
            if config.path.is_dir():
                return ResolvedWeights(config.path, "path")
            tried.append(f"path {config.path}: not a directory")

        found = self.local.lookup(key) or self._hf_cache_snapshot(config)
        if found is not None:
            return ResolvedWeights(found, "local cache")
        tried.append(f"local cache {self.local.root}: no {key}")

        if (cluster := self.cluster) is not None:
            try:
                if cluster.has(key):
                    folder = self.local.fill(key, lambda staging: cluster.download(key, staging))
                    self.local.trim(keep | {key})
                    return ResolvedWeights(folder, "cluster cache")
                tried.append(f"cluster cache {cluster.location}: no {key}")
            except Exception as error:  # noqa: BLE001 - botocore raises many types; any of them is a fault, not a miss
                retryable = True
                tried.append(f"cluster cache {cluster.location}: {type(error).__name__}: {error}")
        else:
            tried.append("cluster cache: not configured (SIE_CLUSTER_CACHE)")

        origin = self._from_origin(config, key, keep, tried, retryable)
        if origin is None:
            raise WeightsNotFound(f"no weights found for {config.id}; tried: " + "; ".join(tried), retryable=retryable)
        if self.cluster is not None:
            try:
                self.cluster.upload(key, origin.path)
            except Exception as error:  # noqa: BLE001 - the weights are served anyway; the upload is a courtesy
                log.warning("could not upload %s to the cluster cache: %s", key, error)
        return origin

    def _from_origin(
        self, config: ModelConfig, key: str, keep: frozenset[str], tried: list[str], retryable: bool
    ) -> ResolvedWeights | None:
        """The weights from the model's bundled package or the Hub; None when neither is there to ask. A Hub failure
        raises WeightsNotFound, retryable unless the Hub said the repository or revision is not there (and no cache
        failed with an error, `retryable`)."""
        if config.bundled_weights:
            bundled = bundled_directory(config.bundled_weights, self._weight_packages, model=config.id)
            if bundled is not None:
                return ResolvedWeights(bundled, "bundled package")
            tried.append(f"bundled_weights {config.bundled_weights}: package not installed")
        if not config.hf_id:
            return None
        if not self._hf_fallback:
            tried.append(
                "Hugging Face Hub: disabled (SIE_HF_FALLBACK=false); put the weights in one of the caches above or "
                "enable it"
            )
            return None
        try:
            hf_id = config.hf_id
            folder = self.local.fill(
                key, lambda staging: snapshot_download(hf_id, revision=config.revision, local_dir=staging)
            )
        except Exception as error:
            tried.append(f"Hugging Face Hub {config.hf_id}: {type(error).__name__}: {error}")
            missing = isinstance(error, _HUB_MISSES)
            raise WeightsNotFound(
                f"no weights found for {config.id}; tried: " + "; ".join(tried), retryable=retryable or not missing
            ) from error
        self.local.trim(keep | {key})
        return ResolvedWeights(folder, "hub")

    def _hf_cache_snapshot(self, config: ModelConfig) -> Path | None:
        """A copy in the Hugging Face cache layout (placed there by other tools)."""
        if not config.hf_id:
            return None
        try:
            return Path(
                snapshot_download(
                    config.hf_id, revision=config.revision, cache_dir=self._hf_cache, local_files_only=True
                )
            )
        except Exception:  # noqa: BLE001 - huggingface_hub raises several types for "not cached"
            return None
