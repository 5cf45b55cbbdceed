"""Hostile input against the standalone worker over gRPC: each request gets its precise status (and a
message a person can act on), and the worker still answers a known request exactly as before."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np
import pytest

from conftest import MINILM
from grpc_helpers import error_reason, stacked
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

MODEL = "test/tiny-mean"
KNOWN = ["a known request", "answered the same after every hostile one"]


def encode_request(**fields) -> inference_pb2.EncodeRequest:
    fields.setdefault("model", MODEL)
    fields.setdefault("items", [types_pb2.Item(text="hello")])
    return inference_pb2.EncodeRequest(**fields)


def texts(count: int, text: str = "x") -> list[types_pb2.Item]:
    return [types_pb2.Item(id=str(index), text=text) for index in range(count)]


def raw_encode(payload: bytes) -> Callable[[grpc.Channel], object]:
    """Send bytes as they are (no protobuf serialization) to Inference/Encode."""
    return lambda channel: channel.unary_unary("/sie.v1.Inference/Encode")(payload, timeout=60)


def raw_stream(payload: bytes) -> Callable[[grpc.Channel], object]:
    """Send bytes as they are as the one message of an Inference/EncodeStream call."""
    return lambda channel: list(channel.stream_stream("/sie.v1.Inference/EncodeStream")(iter([payload]), timeout=60))


def encode(request: inference_pb2.EncodeRequest) -> Callable[[grpc.Channel], object]:
    return lambda channel: inference_pb2_grpc.InferenceStub(channel).Encode(request, timeout=120)


# A well-formed EncodeRequest for MODEL whose one item's text is the bytes b"\xff\xfe" (not UTF-8).
_NOT_UTF8 = encode_request(items=[]).SerializeToString() + b"\x12\x04\x12\x02\xff\xfe"


@dataclass(frozen=True)
class Case:
    name: str
    send: Callable[[grpc.Channel], object]
    code: grpc.StatusCode
    reason: str | None  # None: refused by grpc itself, before any handler (no ErrorInfo)
    message: str
    # For answers: how many results the response must hold.
    results: int | None = None


CASES = [
    Case("no items", encode(encode_request(items=[])), grpc.StatusCode.INVALID_ARGUMENT, "NO_ITEMS", "at least one item"),
    Case("no model", encode(encode_request(model="")), grpc.StatusCode.INVALID_ARGUMENT, "MISSING_MODEL", "model is required"),
    Case(
        "item without text", encode(encode_request(items=[types_pb2.Item(text="ok"), types_pb2.Item(id="x")])),
        grpc.StatusCode.INVALID_ARGUMENT, "ITEM_WITHOUT_TEXT", "items[1] (id 'x'): has no text",
    ),
    Case("unknown model", encode(encode_request(model="nobody/nothing")), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", "available: "),
    Case("model id with path traversal", encode(encode_request(model="../../etc/passwd")), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", "'../../etc/passwd'"),
    Case("absolute path as model id", encode(encode_request(model="/etc/passwd")), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", "'/etc/passwd'"),
    Case(
        "unknown output type", encode(encode_request(output_types=["dense", "sparkly"])),
        grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_OUTPUT_TYPE", "'sparkly'; known: dense, sparse, multivector",
    ),
    Case(
        "output the model does not produce", encode(encode_request(output_types=["sparse"])),
        grpc.StatusCode.INVALID_ARGUMENT, "OUTPUT_NOT_SUPPORTED", "it produces: dense",
    ),
    Case(
        "unknown dtype", encode(encode_request(output_dtype="float64")),
        grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_OUTPUT_DTYPE", "'float64' is not one of float32, float16",
    ),
    Case("negative dims", encode(encode_request(dims=-3)), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DIMS", "dims must be positive"),
    Case("dims too large", encode(encode_request(dims=33)), grpc.StatusCode.INVALID_ARGUMENT, "DIMS_TOO_LARGE", "exceeds the 32"),
    Case("unknown profile", encode(encode_request(profile="turbo")), grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND", "profiles: default"),
    Case("unknown LoRA", encode(encode_request(lora="legal")), grpc.StatusCode.INVALID_ARGUMENT, "LORA_NOT_FOUND", "no LoRA adapter 'legal'"),
    Case(
        "LoRA name with path traversal", encode(encode_request(lora="../../etc/passwd")),
        grpc.StatusCode.INVALID_ARGUMENT, "LORA_NOT_FOUND", "no LoRA adapter '../../etc/passwd'",
    ),
    Case(
        "malformed protobuf bytes", raw_encode(b"\x0a\xff\xff\xff\xff\x0f"),
        grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST", "not a valid sie.v1.EncodeRequest",
    ),
    Case(
        "invalid UTF-8 in a text field", raw_encode(_NOT_UTF8),
        grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST", "not a valid sie.v1.EncodeRequest",
    ),
    Case(
        "malformed protobuf bytes on EncodeStream", raw_stream(b"\x0a\x03\xff"),
        grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST", "not a valid sie.v1.EncodeStreamRequest",
    ),
    Case(
        "oversize message (17 MiB text)", encode(encode_request(items=texts(1, "x" * (17 * 2**20)))),
        grpc.StatusCode.RESOURCE_EXHAUSTED, None, "larger than max",
    ),
    Case("huge batch (4096 items)", encode(encode_request(items=texts(4096, "many small items"))), grpc.StatusCode.OK, None, "", results=4096),
    Case("megabyte text (truncated to the model's length)", encode(encode_request(items=texts(1, "word " * 200_000))), grpc.StatusCode.OK, None, "", results=1),
    Case("unicode edge cases", encode(encode_request(items=texts(1, "\x00\u200b\ufeff🧪\U0010ffff a\u0301"))), grpc.StatusCode.OK, None, "", results=1),
]


@pytest.fixture(scope="module")
def reference(worker) -> np.ndarray:
    with grpc.insecure_channel(worker.address) as channel:
        response = inference_pb2_grpc.InferenceStub(channel).Encode(encode_request(items=[types_pb2.Item(text=t) for t in KNOWN]), timeout=60)
    return stacked(result.dense for result in response.results)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_hostile_request_gets_its_status_and_the_worker_keeps_serving(worker, reference, case, reliability_report) -> None:
    with grpc.insecure_channel(worker.address) as channel:
        try:
            response = case.send(channel)
            code, details = grpc.StatusCode.OK, ""
        except grpc.RpcError as error:
            response, code, details = None, error.code(), error.details() or ""
            reason = error_reason(error) if case.reason is not None and code == case.code else None
        reliability_report.add("hostile input", f"gRPC worker: {case.name}", expected=case.code.name, actual=code.name)
        assert code == case.code, details
        if code != grpc.StatusCode.OK:
            assert case.message in details
            if case.reason is not None:
                assert reason == case.reason
        else:
            assert len(response.results) == case.results
            assert all(np.isfinite(stacked([result.dense])).all() for result in response.results)
        # ...and the worker still answers a known request exactly as before.
        again = inference_pb2_grpc.InferenceStub(channel).Encode(encode_request(items=[types_pb2.Item(text=t) for t in KNOWN]), timeout=60)
        np.testing.assert_array_equal(stacked(result.dense for result in again.results), reference)


def test_get_unknown_model_is_not_found(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetModel(inference_pb2.GetModelRequest(model="nobody/nothing"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_list_models_names_the_demo_and_configured_models(stub) -> None:
    models = {model.id: model for model in stub.ListModels(inference_pb2.ListModelsRequest()).models}
    assert MINILM in models and MODEL in models
    assert models[MINILM].dims == 384
    assert list(models[MINILM].output_types) == ["dense"]


def test_beyond_max_concurrent_requests_is_resource_exhausted(start_worker, reliability_report) -> None:
    # One slot, and a batch window long enough that the first request still holds it.
    worker = start_worker(SIE_MAX_CONCURRENT_REQUESTS="1", SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="3000", SIE_PRELOAD_MODELS=MODEL)
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        first: dict[str, object] = {}
        holder = threading.Thread(target=lambda: first.setdefault("response", stub.Encode(encode_request(), timeout=60)))
        holder.start()
        time.sleep(1.0)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Encode(encode_request(), timeout=60)
        holder.join()
        reliability_report.add("hostile input", "gRPC worker: beyond SIE_MAX_CONCURRENT_REQUESTS", expected="RESOURCE_EXHAUSTED", actual=raised.value.code().name)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "SIE_MAX_CONCURRENT_REQUESTS" in raised.value.details()
        assert error_reason(raised.value) == "QUEUE_FULL"
        assert len(first["response"].results) == 1  # the admitted request was not lost
        assert len(stub.Encode(encode_request(), timeout=60).results) == 1
