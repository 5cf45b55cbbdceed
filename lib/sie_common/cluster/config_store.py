"""Where the control plane keeps model configs and bundles in etcd, and how they are encoded.

Names are under the etcd prefix (`SIE_ETCD_PREFIX`); docs/control-plane.md
has the whole layout. Values are JSON: a model is `ModelConfig.to_dict()`, a
bundle is `Bundle.to_dict()`, so every reader validates them with the same
code that validated them on the way in.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from sie_common.cluster.bundles import Bundle, parse_bundle
from sie_common.cluster.model_config import ModelConfig, ModelConfigError, parse_model_config

log = logging.getLogger(__name__)

T = TypeVar("T")

MODELS = "models/"
BUNDLES = "bundles/"
# Written in the same transaction as every model write: its mod_revision is the epoch.
EPOCH = "epoch"
# The config service's own records: its leader key and its idempotency answers.
CONFIG_SERVICE = "config/"


def model_name(model_id: str) -> str:
    return MODELS + model_id


def bundle_name(bundle_id: str) -> str:
    return BUNDLES + bundle_id


def model_source(model_id: str) -> str:
    """The `source` of a model config read from etcd (what errors about it name)."""
    return f"etcd {model_name(model_id)}"


def is_from_etcd(config: ModelConfig) -> bool:
    """Whether the config came through the control plane rather than from a local file."""
    return config.source == model_source(config.id)


def encode_model(config: ModelConfig) -> bytes:
    return json.dumps(config.to_dict(), sort_keys=True).encode()


def decode_model(value: bytes, *, source: str) -> ModelConfig:
    """Parse a stored model config (raises ModelConfigError)."""
    return parse_model_config(_json(value, source), source=source)


def encode_bundle(bundle: Bundle) -> bytes:
    return json.dumps(bundle.to_dict(), sort_keys=True).encode()


def decode_bundle(value: bytes, *, source: str) -> Bundle:
    return parse_bundle(_json(value, source), source=source)


def decode_models(values: Mapping[str, bytes]) -> dict[str, ModelConfig]:
    """Model id -> config for stored values keyed by model id; a value that does not parse is logged and left out."""
    return _decode_each(values, lambda model_id, value: decode_model(value, source=model_source(model_id)))


def decode_bundles(values: Mapping[str, bytes]) -> dict[str, Bundle]:
    """Bundle id -> bundle for stored values keyed by bundle id; bad ones are logged and left out."""
    return _decode_each(values, lambda bundle_id, value: decode_bundle(value, source=f"etcd {bundle_name(bundle_id)}"))


def _decode_each(values: Mapping[str, bytes], decode: Callable[[str, bytes], T]) -> dict[str, T]:
    decoded = {}
    for name, value in values.items():
        try:
            decoded[name] = decode(name, value)
        except ModelConfigError as error:
            log.error("ignoring a stored value that does not validate: %s", error)
    return decoded


def _json(value: bytes, source: str) -> object:
    try:
        return json.loads(value)
    except ValueError as error:
        raise ModelConfigError(source, "", f"not valid JSON: {error}") from None
