from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Item(_message.Message):
    __slots__ = ("id", "text", "images", "metadata")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    text: str
    images: _containers.RepeatedCompositeFieldContainer[Image]
    metadata: _struct_pb2.Struct
    def __init__(self, id: _Optional[str] = ..., text: _Optional[str] = ..., images: _Optional[_Iterable[_Union[Image, _Mapping]]] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class Image(_message.Message):
    __slots__ = ("data", "format")
    DATA_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    format: str
    def __init__(self, data: _Optional[bytes] = ..., format: _Optional[str] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "values", "scale", "offset")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    values: _containers.RepeatedScalarFieldContainer[float]
    scale: _containers.RepeatedScalarFieldContainer[float]
    offset: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., values: _Optional[_Iterable[float]] = ..., scale: _Optional[_Iterable[float]] = ..., offset: _Optional[_Iterable[float]] = ...) -> None: ...

class SparseVector(_message.Message):
    __slots__ = ("indices", "values", "dims")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    DIMS_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    dims: int
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ..., dims: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms", "total_ms", "batches")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZATION_MS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    POSTPROCESSING_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    postprocessing_ms: float
    total_ms: float
    batches: _containers.RepeatedCompositeFieldContainer[BatchStats]
    def __init__(self, queue_ms: _Optional[float] = ..., tokenization_ms: _Optional[float] = ..., inference_ms: _Optional[float] = ..., postprocessing_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., batches: _Optional[_Iterable[_Union[BatchStats, _Mapping]]] = ...) -> None: ...

class BatchStats(_message.Message):
    __slots__ = ("batch_id", "items", "arrivals", "tokens", "padded_tokens", "padding_fraction", "wait_ms", "staged_ms", "inference_ms", "full", "wait_setting_ms", "budget_tokens", "target_p50_ms", "adaptive")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    ARRIVALS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    PADDED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PADDING_FRACTION_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    STAGED_MS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    WAIT_SETTING_MS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TARGET_P50_MS_FIELD_NUMBER: _ClassVar[int]
    ADAPTIVE_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    items: int
    arrivals: int
    tokens: int
    padded_tokens: int
    padding_fraction: float
    wait_ms: float
    staged_ms: float
    inference_ms: float
    full: bool
    wait_setting_ms: float
    budget_tokens: int
    target_p50_ms: float
    adaptive: bool
    def __init__(self, batch_id: _Optional[int] = ..., items: _Optional[int] = ..., arrivals: _Optional[int] = ..., tokens: _Optional[int] = ..., padded_tokens: _Optional[int] = ..., padding_fraction: _Optional[float] = ..., wait_ms: _Optional[float] = ..., staged_ms: _Optional[float] = ..., inference_ms: _Optional[float] = ..., full: _Optional[bool] = ..., wait_setting_ms: _Optional[float] = ..., budget_tokens: _Optional[int] = ..., target_p50_ms: _Optional[float] = ..., adaptive: _Optional[bool] = ...) -> None: ...
