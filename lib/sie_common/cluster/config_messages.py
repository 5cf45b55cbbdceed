"""Model configs and bundles as sie.v1 messages, and back (the config service, gateways)."""

from __future__ import annotations

from google.protobuf import json_format

from sie.v1 import config_pb2
from sie_common.cluster.bundles import Bundle
from sie_common.cluster.model_config import ModelConfig, ModelConfigError, parse_model_config


def config_to_message(config: ModelConfig) -> config_pb2.ModelConfig:
    return json_format.ParseDict(config.to_dict(), config_pb2.ModelConfig())


def config_from_message(message: config_pb2.ModelConfig, *, source: str) -> ModelConfig:
    """Validate a ModelConfig message with the one validator (raises ModelConfigError)."""
    try:
        data = json_format.MessageToDict(message, preserving_proto_field_name=True)
    except json_format.SerializeToJsonError as error:  # NaN or Infinity in an options value
        raise ModelConfigError(source, "", f"not plain JSON values: {error}") from None
    return parse_model_config(data, source=source)


def bundle_to_message(bundle: Bundle, config_hash: str) -> config_pb2.Bundle:
    return config_pb2.Bundle(
        id=bundle.id,
        adapters=bundle.adapters,
        models=bundle.models,
        config_hash=config_hash,
        priority=bundle.priority,
        exclude_models=bundle.exclude_models,
    )
