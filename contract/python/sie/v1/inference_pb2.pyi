import datetime

from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.rpc import status_pb2 as _status_pb2
from sie.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ModelState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_STATE_UNSPECIFIED: _ClassVar[ModelState]
    MODEL_STATE_AVAILABLE: _ClassVar[ModelState]
    MODEL_STATE_LOADING: _ClassVar[ModelState]
    MODEL_STATE_LOADED: _ClassVar[ModelState]
    MODEL_STATE_FAILED: _ClassVar[ModelState]
    MODEL_STATE_UNLOADING: _ClassVar[ModelState]
MODEL_STATE_UNSPECIFIED: ModelState
MODEL_STATE_AVAILABLE: ModelState
MODEL_STATE_LOADING: ModelState
MODEL_STATE_LOADED: ModelState
MODEL_STATE_FAILED: ModelState
MODEL_STATE_UNLOADING: ModelState

class EncodeRequest(_message.Message):
    __slots__ = ("model", "items", "output_types", "output_dtype", "instruction", "is_query", "dims", "profile", "lora", "options", "request_id", "debug", "params")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DTYPE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    IS_QUERY_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEBUG_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    model: str
    items: _containers.RepeatedCompositeFieldContainer[_types_pb2.Item]
    output_types: _containers.RepeatedScalarFieldContainer[str]
    output_dtype: str
    instruction: str
    is_query: bool
    dims: int
    profile: str
    lora: str
    options: _struct_pb2.Struct
    request_id: str
    debug: bool
    params: EncodeParams
    def __init__(self, model: _Optional[str] = ..., items: _Optional[_Iterable[_Union[_types_pb2.Item, _Mapping]]] = ..., output_types: _Optional[_Iterable[str]] = ..., output_dtype: _Optional[str] = ..., instruction: _Optional[str] = ..., is_query: _Optional[bool] = ..., dims: _Optional[int] = ..., profile: _Optional[str] = ..., lora: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ..., debug: _Optional[bool] = ..., params: _Optional[_Union[EncodeParams, _Mapping]] = ...) -> None: ...

class EncodeParams(_message.Message):
    __slots__ = ("output_types", "output_dtype", "instruction", "is_query", "dims", "profile", "lora", "options")
    OUTPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DTYPE_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    IS_QUERY_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    output_types: _containers.RepeatedScalarFieldContainer[str]
    output_dtype: str
    instruction: str
    is_query: bool
    dims: int
    profile: str
    lora: str
    options: _struct_pb2.Struct
    def __init__(self, output_types: _Optional[_Iterable[str]] = ..., output_dtype: _Optional[str] = ..., instruction: _Optional[str] = ..., is_query: _Optional[bool] = ..., dims: _Optional[int] = ..., profile: _Optional[str] = ..., lora: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class EncodeResponse(_message.Message):
    __slots__ = ("request_id", "model", "results", "timing", "tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    results: _containers.RepeatedCompositeFieldContainer[EncodeResult]
    timing: _types_pb2.Timing
    tokens: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., results: _Optional[_Iterable[_Union[EncodeResult, _Mapping]]] = ..., timing: _Optional[_Union[_types_pb2.Timing, _Mapping]] = ..., tokens: _Optional[int] = ...) -> None: ...

class EncodeResult(_message.Message):
    __slots__ = ("id", "dense", "sparse", "multivector")
    ID_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    MULTIVECTOR_FIELD_NUMBER: _ClassVar[int]
    id: str
    dense: _types_pb2.Tensor
    sparse: _types_pb2.SparseVector
    multivector: _types_pb2.Tensor
    def __init__(self, id: _Optional[str] = ..., dense: _Optional[_Union[_types_pb2.Tensor, _Mapping]] = ..., sparse: _Optional[_Union[_types_pb2.SparseVector, _Mapping]] = ..., multivector: _Optional[_Union[_types_pb2.Tensor, _Mapping]] = ...) -> None: ...

class EncodeStreamRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: EncodeRequest
    def __init__(self, request: _Optional[_Union[EncodeRequest, _Mapping]] = ...) -> None: ...

class EncodeStreamResponse(_message.Message):
    __slots__ = ("request_id", "response", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    response: EncodeResponse
    error: _status_pb2.Status
    def __init__(self, request_id: _Optional[str] = ..., response: _Optional[_Union[EncodeResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("model", "query", "items", "top_k", "profile", "lora", "options", "request_id", "instruction", "debug", "params")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    DEBUG_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    model: str
    query: _types_pb2.Item
    items: _containers.RepeatedCompositeFieldContainer[_types_pb2.Item]
    top_k: int
    profile: str
    lora: str
    options: _struct_pb2.Struct
    request_id: str
    instruction: str
    debug: bool
    params: ScoreParams
    def __init__(self, model: _Optional[str] = ..., query: _Optional[_Union[_types_pb2.Item, _Mapping]] = ..., items: _Optional[_Iterable[_Union[_types_pb2.Item, _Mapping]]] = ..., top_k: _Optional[int] = ..., profile: _Optional[str] = ..., lora: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ..., instruction: _Optional[str] = ..., debug: _Optional[bool] = ..., params: _Optional[_Union[ScoreParams, _Mapping]] = ...) -> None: ...

class ScoreParams(_message.Message):
    __slots__ = ("top_k", "instruction", "profile", "lora", "options")
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    top_k: int
    instruction: str
    profile: str
    lora: str
    options: _struct_pb2.Struct
    def __init__(self, top_k: _Optional[int] = ..., instruction: _Optional[str] = ..., profile: _Optional[str] = ..., lora: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("request_id", "model", "scores", "timing", "tokens", "images")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    scores: _containers.RepeatedCompositeFieldContainer[ScoreEntry]
    timing: _types_pb2.Timing
    tokens: int
    images: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., scores: _Optional[_Iterable[_Union[ScoreEntry, _Mapping]]] = ..., timing: _Optional[_Union[_types_pb2.Timing, _Mapping]] = ..., tokens: _Optional[int] = ..., images: _Optional[int] = ...) -> None: ...

class ScoreEntry(_message.Message):
    __slots__ = ("item_id", "index", "score", "rank")
    ITEM_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    item_id: str
    index: int
    score: float
    rank: int
    def __init__(self, item_id: _Optional[str] = ..., index: _Optional[int] = ..., score: _Optional[float] = ..., rank: _Optional[int] = ...) -> None: ...

class ExtractRequest(_message.Message):
    __slots__ = ("model", "items", "labels", "threshold", "profile", "lora", "options", "request_id", "debug", "params")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DEBUG_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    model: str
    items: _containers.RepeatedCompositeFieldContainer[_types_pb2.Item]
    labels: _containers.RepeatedScalarFieldContainer[str]
    threshold: float
    profile: str
    lora: str
    options: _struct_pb2.Struct
    request_id: str
    debug: bool
    params: ExtractParams
    def __init__(self, model: _Optional[str] = ..., items: _Optional[_Iterable[_Union[_types_pb2.Item, _Mapping]]] = ..., labels: _Optional[_Iterable[str]] = ..., threshold: _Optional[float] = ..., profile: _Optional[str] = ..., lora: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., request_id: _Optional[str] = ..., debug: _Optional[bool] = ..., params: _Optional[_Union[ExtractParams, _Mapping]] = ...) -> None: ...

class ExtractParams(_message.Message):
    __slots__ = ("labels", "threshold", "profile", "lora", "options")
    LABELS_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.RepeatedScalarFieldContainer[str]
    threshold: float
    profile: str
    lora: str
    options: _struct_pb2.Struct
    def __init__(self, labels: _Optional[_Iterable[str]] = ..., threshold: _Optional[float] = ..., profile: _Optional[str] = ..., lora: _Optional[str] = ..., options: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ExtractResponse(_message.Message):
    __slots__ = ("request_id", "model", "results", "timing")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    results: _containers.RepeatedCompositeFieldContainer[ExtractResult]
    timing: _types_pb2.Timing
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., results: _Optional[_Iterable[_Union[ExtractResult, _Mapping]]] = ..., timing: _Optional[_Union[_types_pb2.Timing, _Mapping]] = ...) -> None: ...

class ExtractResult(_message.Message):
    __slots__ = ("id", "entities", "classifications", "relations", "objects", "data")
    ID_FIELD_NUMBER: _ClassVar[int]
    ENTITIES_FIELD_NUMBER: _ClassVar[int]
    CLASSIFICATIONS_FIELD_NUMBER: _ClassVar[int]
    RELATIONS_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    entities: _containers.RepeatedCompositeFieldContainer[Entity]
    classifications: _containers.RepeatedCompositeFieldContainer[Classification]
    relations: _containers.RepeatedCompositeFieldContainer[Relation]
    objects: _containers.RepeatedCompositeFieldContainer[DetectedObject]
    data: _struct_pb2.Struct
    def __init__(self, id: _Optional[str] = ..., entities: _Optional[_Iterable[_Union[Entity, _Mapping]]] = ..., classifications: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., relations: _Optional[_Iterable[_Union[Relation, _Mapping]]] = ..., objects: _Optional[_Iterable[_Union[DetectedObject, _Mapping]]] = ..., data: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Relation(_message.Message):
    __slots__ = ("head", "tail", "label", "score")
    HEAD_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    head: Entity
    tail: Entity
    label: str
    score: float
    def __init__(self, head: _Optional[_Union[Entity, _Mapping]] = ..., tail: _Optional[_Union[Entity, _Mapping]] = ..., label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class DetectedObject(_message.Message):
    __slots__ = ("label", "score", "box")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    BOX_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    box: Box
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ..., box: _Optional[_Union[Box, _Mapping]] = ...) -> None: ...

class Box(_message.Message):
    __slots__ = ("x_min", "y_min", "x_max", "y_max")
    X_MIN_FIELD_NUMBER: _ClassVar[int]
    Y_MIN_FIELD_NUMBER: _ClassVar[int]
    X_MAX_FIELD_NUMBER: _ClassVar[int]
    Y_MAX_FIELD_NUMBER: _ClassVar[int]
    x_min: float
    y_min: float
    x_max: float
    y_max: float
    def __init__(self, x_min: _Optional[float] = ..., y_min: _Optional[float] = ..., x_max: _Optional[float] = ..., y_max: _Optional[float] = ...) -> None: ...

class Entity(_message.Message):
    __slots__ = ("text", "label", "score", "start", "end")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    text: str
    label: str
    score: float
    start: int
    end: int
    def __init__(self, text: _Optional[str] = ..., label: _Optional[str] = ..., score: _Optional[float] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class CreateEmbeddingsRequest(_message.Message):
    __slots__ = ("input", "model", "encoding_format", "dimensions", "user")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FORMAT_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    input: _struct_pb2.Value
    model: str
    encoding_format: str
    dimensions: int
    user: str
    def __init__(self, input: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., model: _Optional[str] = ..., encoding_format: _Optional[str] = ..., dimensions: _Optional[int] = ..., user: _Optional[str] = ...) -> None: ...

class CreateEmbeddingsResponse(_message.Message):
    __slots__ = ("object", "data", "model", "usage")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    object: str
    data: _containers.RepeatedCompositeFieldContainer[Embedding]
    model: str
    usage: EmbeddingsUsage
    def __init__(self, object: _Optional[str] = ..., data: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[EmbeddingsUsage, _Mapping]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("object", "index", "embedding")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    object: str
    index: int
    embedding: _struct_pb2.Value
    def __init__(self, object: _Optional[str] = ..., index: _Optional[int] = ..., embedding: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ...) -> None: ...

class EmbeddingsUsage(_message.Message):
    __slots__ = ("prompt_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "config_problems")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    CONFIG_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[Model]
    config_problems: _containers.RepeatedCompositeFieldContainer[ConfigProblem]
    def __init__(self, models: _Optional[_Iterable[_Union[Model, _Mapping]]] = ..., config_problems: _Optional[_Iterable[_Union[ConfigProblem, _Mapping]]] = ...) -> None: ...

class ConfigProblem(_message.Message):
    __slots__ = ("source", "message")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    source: str
    message: str
    def __init__(self, source: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class GetModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class DescribeModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class GetModelResponse(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: Model
    def __init__(self, model: _Optional[_Union[Model, _Mapping]] = ...) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "tasks", "output_types", "dims", "max_sequence_length", "profiles", "state", "stats", "inputs", "loras", "loaded_loras", "failure", "memory_bytes", "rollouts", "loaded_on")
    ID_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TYPES_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    LORAS_FIELD_NUMBER: _ClassVar[int]
    LOADED_LORAS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ROLLOUTS_FIELD_NUMBER: _ClassVar[int]
    LOADED_ON_FIELD_NUMBER: _ClassVar[int]
    id: str
    tasks: _containers.RepeatedScalarFieldContainer[str]
    output_types: _containers.RepeatedScalarFieldContainer[str]
    dims: int
    max_sequence_length: int
    profiles: _containers.RepeatedScalarFieldContainer[str]
    state: ModelState
    stats: ModelStats
    inputs: _containers.RepeatedScalarFieldContainer[str]
    loras: _containers.RepeatedScalarFieldContainer[str]
    loaded_loras: _containers.RepeatedScalarFieldContainer[str]
    failure: ModelLoadFailure
    memory_bytes: int
    rollouts: _containers.RepeatedCompositeFieldContainer[ModelRollout]
    loaded_on: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., tasks: _Optional[_Iterable[str]] = ..., output_types: _Optional[_Iterable[str]] = ..., dims: _Optional[int] = ..., max_sequence_length: _Optional[int] = ..., profiles: _Optional[_Iterable[str]] = ..., state: _Optional[_Union[ModelState, str]] = ..., stats: _Optional[_Union[ModelStats, _Mapping]] = ..., inputs: _Optional[_Iterable[str]] = ..., loras: _Optional[_Iterable[str]] = ..., loaded_loras: _Optional[_Iterable[str]] = ..., failure: _Optional[_Union[ModelLoadFailure, _Mapping]] = ..., memory_bytes: _Optional[int] = ..., rollouts: _Optional[_Iterable[_Union[ModelRollout, _Mapping]]] = ..., loaded_on: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelLoadFailure(_message.Message):
    __slots__ = ("error", "attempts", "permanent", "retry_in_s")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    RETRY_IN_S_FIELD_NUMBER: _ClassVar[int]
    error: str
    attempts: int
    permanent: bool
    retry_in_s: float
    def __init__(self, error: _Optional[str] = ..., attempts: _Optional[int] = ..., permanent: _Optional[bool] = ..., retry_in_s: _Optional[float] = ...) -> None: ...

class ModelRollout(_message.Message):
    __slots__ = ("bundle", "config_hash", "current_workers", "lagging_workers")
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_HASH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_WORKERS_FIELD_NUMBER: _ClassVar[int]
    LAGGING_WORKERS_FIELD_NUMBER: _ClassVar[int]
    bundle: str
    config_hash: str
    current_workers: _containers.RepeatedScalarFieldContainer[str]
    lagging_workers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, bundle: _Optional[str] = ..., config_hash: _Optional[str] = ..., current_workers: _Optional[_Iterable[str]] = ..., lagging_workers: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelStats(_message.Message):
    __slots__ = ("requests", "items", "forward_passes")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    FORWARD_PASSES_FIELD_NUMBER: _ClassVar[int]
    requests: int
    items: int
    forward_passes: int
    def __init__(self, requests: _Optional[int] = ..., items: _Optional[int] = ..., forward_passes: _Optional[int] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ("name", "gpus", "ttl_s", "expires_at", "workers", "ready", "bundle")
    class GpusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpus: _containers.ScalarMap[str, int]
    ttl_s: int
    expires_at: _timestamp_pb2.Timestamp
    workers: _containers.RepeatedScalarFieldContainer[str]
    ready: bool
    bundle: str
    def __init__(self, name: _Optional[str] = ..., gpus: _Optional[_Mapping[str, int]] = ..., ttl_s: _Optional[int] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., workers: _Optional[_Iterable[str]] = ..., ready: _Optional[bool] = ..., bundle: _Optional[str] = ...) -> None: ...

class CreatePoolRequest(_message.Message):
    __slots__ = ("name", "gpus", "ttl_s", "bundle")
    class GpusEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    name: str
    gpus: _containers.ScalarMap[str, int]
    ttl_s: int
    bundle: str
    def __init__(self, name: _Optional[str] = ..., gpus: _Optional[_Mapping[str, int]] = ..., ttl_s: _Optional[int] = ..., bundle: _Optional[str] = ...) -> None: ...

class CreatePoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class GetPoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class GetPoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ...) -> None: ...

class RenewPoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RenewPoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: Pool
    def __init__(self, pool: _Optional[_Union[Pool, _Mapping]] = ...) -> None: ...

class DeletePoolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeletePoolResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
