"""Reading rich gRPC errors, and calling a model that may still be loading."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import numpy as np
from google.rpc import error_details_pb2, status_pb2

from sie.v1 import inference_pb2, types_pb2
from sie_common.tensors import from_tensor

T = TypeVar("T")


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    details = dict(error.trailing_metadata() or ())["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(details)
    info = error_details_pb2.ErrorInfo()
    assert any(detail.Unpack(info) for detail in status.details)
    assert info.domain == "sie"
    return info


def retry_delay_s(error: grpc.RpcError) -> float:
    status = status_pb2.Status.FromString(dict(error.trailing_metadata())["grpc-status-details-bin"])
    retry = error_details_pb2.RetryInfo()
    assert any(detail.Unpack(retry) for detail in status.details), "no RetryInfo"
    return retry.retry_delay.ToNanoseconds() / 1e9


def encode_request(model: str, texts: list[str]) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)])


def when_loaded(call: Callable[[], T], timeout_s: float = 120) -> tuple[T, int]:
    """`call()`, retried while the model loads (as a client honouring RetryInfo would).

    Returns its result and how many MODEL_LOADING answers came first."""
    deadline = time.monotonic() + timeout_s
    loading = 0
    while True:
        try:
            return call(), loading
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or error_info(error).reason != "MODEL_LOADING":
                raise
            assert retry_delay_s(error) > 0
            loading += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(min(retry_delay_s(error), 0.5))


def encode_when_loaded(stub, model: str, texts: list[str], timeout_s: float = 120) -> tuple[np.ndarray, int]:
    """Encode once the model is loaded: the vectors, and how many MODEL_LOADING answers came first."""
    response, loading = when_loaded(lambda: stub.Encode(encode_request(model, texts), timeout=60), timeout_s)
    return np.stack([from_tensor(result.dense) for result in response.results]), loading
