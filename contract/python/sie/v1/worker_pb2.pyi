import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.rpc import status_pb2 as _status_pb2
from sie.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkRequest(_message.Message):
    __slots__ = ("request_id", "timeout", "encode", "score", "extract", "cancel", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    ENCODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    EXTRACT_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    timeout: _duration_pb2.Duration
    encode: _inference_pb2.EncodeRequest
    score: _inference_pb2.ScoreRequest
    extract: _inference_pb2.ExtractRequest
    cancel: CancelWork
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, request_id: _Optional[str] = ..., timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., encode: _Optional[_Union[_inference_pb2.EncodeRequest, _Mapping]] = ..., score: _Optional[_Union[_inference_pb2.ScoreRequest, _Mapping]] = ..., extract: _Optional[_Union[_inference_pb2.ExtractRequest, _Mapping]] = ..., cancel: _Optional[_Union[CancelWork, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CancelWork(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkResponse(_message.Message):
    __slots__ = ("request_id", "worker_id", "encode", "score", "extract", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    EXTRACT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    worker_id: str
    encode: _inference_pb2.EncodeResponse
    score: _inference_pb2.ScoreResponse
    extract: _inference_pb2.ExtractResponse
    error: _status_pb2.Status
    def __init__(self, request_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., encode: _Optional[_Union[_inference_pb2.EncodeResponse, _Mapping]] = ..., score: _Optional[_Union[_inference_pb2.ScoreResponse, _Mapping]] = ..., extract: _Optional[_Union[_inference_pb2.ExtractResponse, _Mapping]] = ..., error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ...) -> None: ...
