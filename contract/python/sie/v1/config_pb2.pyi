from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelConfig(_message.Message):
    __slots__ = ("id", "hf_id", "revision", "path", "tasks", "output_types", "dims", "max_sequence_length", "profiles", "inputs", "bundled_weights", "loras")
    class ProfilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: ModelProfile
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[ModelProfile, _Mapping]] = ...) -> None: ...
    class LorasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    HF_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    BUNDLED_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LORAS_FIELD_NUMBER: _ClassVar[int]
    id: str
    hf_id: str
    revision: str
    path: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    output_types: _containers.RepeatedScalarFieldContainer[str]
    dims: int
    max_sequence_length: int
    profiles: _containers.MessageMap[str, ModelProfile]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    bundled_weights: str
    loras: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., hf_id: _Optional[str] = ..., revision: _Optional[str] = ..., path: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ..., output_types: _Optional[_Iterable[str]] = ..., dims: _Optional[int] = ..., max_sequence_length: _Optional[int] = ..., profiles: _Optional[_Mapping[str, ModelProfile]] = ..., inputs: _Optional[_Iterable[str]] = ..., bundled_weights: _Optional[str] = ..., loras: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ModelProfile(_message.Message):
    __slots__ = ("extends", "adapter", "load_options", "run_options", "max_batch_tokens", "compute_precision", "adaptive_batching")
    EXTENDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    LOAD_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    RUN_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_PRECISION_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_BATCHING_FIELD_NUMBER: _ClassVar[int]
    extends: str
    adapter: str
    load_options: _struct_pb2.Struct
    run_options: _struct_pb2.Struct
    max_batch_tokens: int
    compute_precision: str
    adaptive_batching: bool
    def __init__(self, extends: _Optional[str] = ..., adapter: _Optional[str] = ..., load_options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., run_options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., max_batch_tokens: _Optional[int] = ..., compute_precision: _Optional[str] = ..., adaptive_batching: _Optional[bool] = ...) -> None: ...

class Bundle(_message.Message):
    __slots__ = ("id", "adapters", "config_hash", "priority", "models", "exclude_models")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_MODELS_FIELD_NUMBER: _ClassVar[int]
    id: str
    adapters: _containers.RepeatedScalarFieldContainer[str]
    config_hash: str
    priority: int
    models: _containers.RepeatedScalarFieldContainer[str]
    exclude_models: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., adapters: _Optional[_Iterable[str]] = ..., config_hash: _Optional[str] = ..., priority: _Optional[int] = ..., models: _Optional[_Iterable[str]] = ..., exclude_models: _Optional[_Iterable[str]] = ...) -> None: ...

class AddModelRequest(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: ModelConfig
    def __init__(self, config: _Optional[_Union[ModelConfig, _Mapping]] = ...) -> None: ...

class AddModelResponse(_message.Message):
    __slots__ = ("model", "created", "added_profiles", "skipped_profiles", "epoch")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ADDED_PROFILES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_PROFILES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    model: str
    created: bool
    added_profiles: _containers.RepeatedScalarFieldContainer[str]
    skipped_profiles: _containers.RepeatedScalarFieldContainer[str]
    epoch: int
    def __init__(self, model: _Optional[str] = ..., created: _Optional[bool] = ..., added_profiles: _Optional[_Iterable[str]] = ..., skipped_profiles: _Optional[_Iterable[str]] = ..., epoch: _Optional[int] = ...) -> None: ...

class GetModelConfigRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetModelConfigResponse(_message.Message):
    __slots__ = ("config",)
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    config: ModelConfig
    def __init__(self, config: _Optional[_Union[ModelConfig, _Mapping]] = ...) -> None: ...

class ListModelConfigsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelConfigsResponse(_message.Message):
    __slots__ = ("configs",)
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[ModelConfig]
    def __init__(self, configs: _Optional[_Iterable[_Union[ModelConfig, _Mapping]]] = ...) -> None: ...

class ExportConfigsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ExportConfigsResponse(_message.Message):
    __slots__ = ("configs", "bundles", "epoch", "bundle_set_hash")
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_SET_HASH_FIELD_NUMBER: _ClassVar[int]
    configs: _containers.RepeatedCompositeFieldContainer[ModelConfig]
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    epoch: int
    bundle_set_hash: str
    def __init__(self, configs: _Optional[_Iterable[_Union[ModelConfig, _Mapping]]] = ..., bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ..., epoch: _Optional[int] = ..., bundle_set_hash: _Optional[str] = ...) -> None: ...

class GetEpochRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetEpochResponse(_message.Message):
    __slots__ = ("epoch", "bundle_set_hash")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_SET_HASH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    bundle_set_hash: str
    def __init__(self, epoch: _Optional[int] = ..., bundle_set_hash: _Optional[str] = ...) -> None: ...

class ListBundlesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListBundlesResponse(_message.Message):
    __slots__ = ("bundles",)
    BUNDLES_FIELD_NUMBER: _ClassVar[int]
    bundles: _containers.RepeatedCompositeFieldContainer[Bundle]
    def __init__(self, bundles: _Optional[_Iterable[_Union[Bundle, _Mapping]]] = ...) -> None: ...

class GetBundleRequest(_message.Message):
    __slots__ = ("bundle_id",)
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    bundle_id: str
    def __init__(self, bundle_id: _Optional[str] = ...) -> None: ...

class GetBundleResponse(_message.Message):
    __slots__ = ("bundle",)
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    bundle: Bundle
    def __init__(self, bundle: _Optional[_Union[Bundle, _Mapping]] = ...) -> None: ...
