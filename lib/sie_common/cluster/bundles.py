"""Bundles: what a worker image can serve, and the hashes that show config drift.

A bundle is one YAML file (`bundles/<id>.yaml`):

    id: default
    adapters: [sentence_transformer]   # adapters the image can run
    models: []                         # optional: only these model ids
    exclude_models: []                 # optional: never these model ids (served by another bundle)
    priority: 0                        # higher wins when several bundles can serve a model

A model belongs to a bundle when the adapter of its default profile is one the
bundle runs (and, if the bundle lists models, the model is listed; it is not
among the bundle's excluded models).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sie_common.cluster.model_config import ModelConfig, ModelConfigError

_KEYS = {"id", "adapters", "models", "exclude_models", "priority"}


def repository_bundles_dir() -> Path | None:
    """The repository's bundles/ when the services run from a checkout (lib/sie_common here, an editable install);
    None for an installed distribution, which has no repository beside it."""
    lib = Path(__file__).resolve().parents[2]
    directory = lib.parent / "bundles"
    return directory if lib.name == "lib" and directory.is_dir() else None


@dataclass(frozen=True)
class Bundle:
    id: str
    adapters: tuple[str, ...]
    models: tuple[str, ...] = ()
    priority: int = 0
    exclude_models: tuple[str, ...] = ()

    def can_serve(self, config: ModelConfig) -> bool:
        if (self.models and config.id not in self.models) or config.id in self.exclude_models:
            return False
        return config.profile().adapter in self.adapters

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "id": self.id,
            "adapters": list(self.adapters),
            "models": list(self.models),
            "priority": self.priority,
        }
        if self.exclude_models:  # left out when empty, so bundles without it hash as before
            data["exclude_models"] = list(self.exclude_models)
        return data


def parse_bundle(data: Any, *, source: str) -> Bundle:
    """Validate a bundle mapping; errors name the source, field and problem."""
    if not isinstance(data, Mapping):
        raise ModelConfigError(source, "", "a bundle must be a mapping")
    unknown = sorted(str(key) for key in data if key not in _KEYS)
    if unknown:
        raise ModelConfigError(source, unknown[0], f"unknown field; expected one of {', '.join(sorted(_KEYS))}")
    bundle_id = data.get("id")
    if not isinstance(bundle_id, str) or not bundle_id:
        raise ModelConfigError(source, "id", "required: a non-empty string")
    adapters = data.get("adapters")
    if not isinstance(adapters, list) or not adapters or not all(isinstance(a, str) and a for a in adapters):
        raise ModelConfigError(source, "adapters", "required: a non-empty list of adapter names")
    models = _listed(data, "models")
    if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
        raise ModelConfigError(source, "models", "must be a list of model ids")
    excluded = _listed(data, "exclude_models")
    if not isinstance(excluded, list) or not all(isinstance(m, str) and m for m in excluded):
        raise ModelConfigError(source, "exclude_models", "must be a list of model ids")
    both = sorted(set(models) & set(excluded))
    if both:
        raise ModelConfigError(
            source, "exclude_models", f"lists {both[0]!r}, which models lists too (no bundle would serve it)"
        )
    priority = data.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ModelConfigError(source, "priority", f"must be an integer, got {priority!r}")
    return Bundle(bundle_id, tuple(adapters), tuple(models), priority, tuple(excluded))


def _listed(data: Mapping[str, Any], key: str) -> Any:
    """The field's value, with null (YAML's empty `models:`) read as the empty list; any other value as given."""
    value = data.get(key)
    return [] if value is None else value


def load_bundles(directory: Path) -> dict[str, Bundle]:
    """Every `*.yaml` bundle in a directory, by id."""
    bundles: dict[str, Bundle] = {}
    for path in sorted(directory.glob("*.yaml")):
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            raise ModelConfigError(str(path), "", f"not valid YAML: {error}") from None
        bundle = parse_bundle(data, source=str(path))
        if bundle.id in bundles:
            raise ModelConfigError(str(path), "id", f"bundle {bundle.id!r} is defined twice")
        bundles[bundle.id] = bundle
    return bundles


# Model digests add up modulo 2**64, so a bundle's hash follows one model change in O(1).
_DIGEST_MODULUS = 2**64


def model_digest(config: ModelConfig) -> int:
    """One model config's share of the config hash of each bundle that serves it."""
    return int(_digest(config.to_dict()), 16)


def _combined_hash(bundle: Bundle, digest_sum: int) -> str:
    return _digest({"bundle": bundle.to_dict(), "models": digest_sum % _DIGEST_MODULUS})


def bundle_config_hash(bundle: Bundle, configs: Iterable[ModelConfig]) -> str:
    """Hash of a bundle and the model configs it serves: equal hashes mean equal served config."""
    return _combined_hash(bundle, sum(model_digest(config) for config in configs if bundle.can_serve(config)))


class BundleHashes:
    """`bundle_config_hash` of every bundle, kept current one change at a time.

    A model change costs one digest and O(bundles) additions; a bundle change
    re-adds the digests of the models it serves (bundles change rarely).
    """

    def __init__(self) -> None:
        self._bundles: dict[str, Bundle] = {}
        self._models: dict[str, tuple[ModelConfig, int]] = {}
        self._sums: dict[str, int] = {}

    def put_model(self, config: ModelConfig) -> None:
        self.remove_model(config.id)
        digest = model_digest(config)
        self._models[config.id] = (config, digest)
        for bundle in self._bundles.values():
            if bundle.can_serve(config):
                self._sums[bundle.id] += digest

    def remove_model(self, model_id: str) -> None:
        old = self._models.pop(model_id, None)
        if old is None:
            return
        config, digest = old
        for bundle in self._bundles.values():
            if bundle.can_serve(config):
                self._sums[bundle.id] -= digest

    def put_bundle(self, bundle: Bundle) -> None:
        self._bundles[bundle.id] = bundle
        self._sums[bundle.id] = sum(digest for config, digest in self._models.values() if bundle.can_serve(config))

    def remove_bundle(self, bundle_id: str) -> None:
        self._bundles.pop(bundle_id, None)
        self._sums.pop(bundle_id, None)

    def hash(self, bundle_id: str) -> str | None:
        """The bundle's config hash (None for a bundle not put)."""
        bundle = self._bundles.get(bundle_id)
        return None if bundle is None else _combined_hash(bundle, self._sums[bundle_id])

    def hashes(self) -> dict[str, str]:
        return {bundle_id: _combined_hash(bundle, self._sums[bundle_id]) for bundle_id, bundle in self._bundles.items()}


def bundle_set_hash(bundles: Iterable[Bundle]) -> str:
    """Hash of a set of bundle definitions (not of the models they serve)."""
    return _digest(sorted((bundle.to_dict() for bundle in bundles), key=lambda b: b["id"]))


def _digest(data: Any) -> str:
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
