"""Small helpers the tests share for calling a worker and reading rich errors."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc
import numpy as np
from google.rpc import error_details_pb2, status_pb2

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

T = TypeVar("T")


def items(texts: list[str]) -> list[types_pb2.Item]:
    return [types_pb2.Item(id=f"item-{index}", text=text) for index, text in enumerate(texts)]


def error_details(error: grpc.RpcError) -> tuple[error_details_pb2.ErrorInfo | None, error_details_pb2.RetryInfo | None]:
    """ErrorInfo and RetryInfo from the grpc-status-details-bin trailer."""
    info = retry = None
    for key, value in error.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                    retry = error_details_pb2.RetryInfo()
                    detail.Unpack(retry)
    return info, retry


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo:
    """The ErrorInfo a SIE error carries (domain `sie`)."""
    info, _ = error_details(error)
    assert info is not None and info.domain == "sie", f"no SIE ErrorInfo in {error}"
    return info


def error_reason(error: grpc.RpcError) -> str:
    return error_info(error).reason


def retry_delay_s(error: grpc.RpcError) -> float:
    _, retry = error_details(error)
    assert retry is not None, f"no RetryInfo in {error}"
    return retry.retry_delay.ToNanoseconds() / 1e9


LOADING_REASONS = ("MODEL_LOADING", "LORA_LOADING")


def call_until_loaded(call: Callable[[], T], timeout_s: float = 120) -> tuple[T, int]:
    """Repeat `call` while it answers UNAVAILABLE because a model or LoRA adapter is loading (as a client
    honouring RetryInfo would); the answer and how many such answers came first."""
    deadline = time.monotonic() + timeout_s
    waits = 0
    while True:
        try:
            return call(), waits
        except grpc.RpcError as error:
            info, _ = error_details(error)
            if error.code() != grpc.StatusCode.UNAVAILABLE or info is None or info.reason not in LOADING_REASONS:
                raise
            delay = retry_delay_s(error)
            assert delay > 0
            if time.monotonic() > deadline:
                raise
            waits += 1
            time.sleep(min(delay, 0.2))


def encode_request(model: str, texts: list[str]) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)])


def encode_when_loaded(stub, model: str, texts: list[str], timeout_s: float = 120) -> tuple[np.ndarray, int]:
    """Encode once the model is loaded: the vectors, and how many loading answers came first."""
    response, waits = call_until_loaded(lambda: stub.Encode(encode_request(model, texts), timeout=60), timeout_s)
    return stacked(result.dense for result in response.results), waits


def forward_passes(stub: inference_pb2_grpc.InferenceStub, model: str) -> int:
    return stub.GetModel(inference_pb2.GetModelRequest(model=model)).model.stats.forward_passes


def stacked(tensors) -> np.ndarray:
    from sie_contract.tensors import from_tensor

    return np.stack([np.array(from_tensor(tensor)) for tensor in tensors])


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata presenting `token` as a bearer token."""
    return (("authorization", f"Bearer {token}"),)
