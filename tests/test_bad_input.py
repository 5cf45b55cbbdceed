"""Bad input gets a precise status and a message a person can act on; the server keeps serving."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from conftest import MINILM
from grpc_helpers import error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

MODEL = "test/tiny-mean"


def encode_request(**fields) -> inference_pb2.EncodeRequest:
    fields.setdefault("model", MODEL)
    fields.setdefault("items", [types_pb2.Item(text="hello")])
    return inference_pb2.EncodeRequest(**fields)


def error_reason(error: grpc.RpcError) -> str:
    return error_info(error).reason


CASES = [
    ("no items", encode_request(items=[]), grpc.StatusCode.INVALID_ARGUMENT, "NO_ITEMS", "at least one item"),
    ("no model", encode_request(model=""), grpc.StatusCode.INVALID_ARGUMENT, "MISSING_MODEL", "model is required"),
    (
        "item without text",
        encode_request(items=[types_pb2.Item(text="ok"), types_pb2.Item(id="x")]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "ITEM_WITHOUT_TEXT",
        "items[1] (id 'x'): has no text",
    ),
    ("unknown model", encode_request(model="nobody/nothing"), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", "available: "),
    (
        "unknown output type",
        encode_request(output_types=["dense", "sparkly"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "UNKNOWN_OUTPUT_TYPE",
        "'sparkly'; known: dense, sparse, multivector",
    ),
    (
        "output the model does not produce",
        encode_request(output_types=["sparse"]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "OUTPUT_NOT_SUPPORTED",
        "it produces: dense",
    ),
    (
        "unknown dtype",
        encode_request(output_dtype="float64"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "UNKNOWN_OUTPUT_DTYPE",
        "'float64' is not one of float32, float16",
    ),
    ("negative dims", encode_request(dims=-3), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DIMS", "dims must be positive"),
    ("dims too large", encode_request(dims=33), grpc.StatusCode.INVALID_ARGUMENT, "DIMS_TOO_LARGE", "exceeds the 32"),
    ("unknown profile", encode_request(profile="turbo"), grpc.StatusCode.NOT_FOUND, "PROFILE_NOT_FOUND", "profiles: default"),
    ("unknown lora", encode_request(lora="legal"), grpc.StatusCode.INVALID_ARGUMENT, "LORA_NOT_FOUND", "no LoRA adapter 'legal'"),
]


@pytest.mark.parametrize(("name", "request_", "code", "reason", "message"), CASES, ids=[case[0] for case in CASES])
def test_bad_request_gets_precise_status(stub, name, request_, code, reason, message) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.Encode(request_, timeout=60)
    assert raised.value.code() == code
    assert message in raised.value.details()
    assert error_reason(raised.value) == reason
    # ...and the server still answers a good request.
    assert len(stub.Encode(encode_request(), timeout=60).results) == 1


def test_get_unknown_model_is_not_found(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        stub.GetModel(inference_pb2.GetModelRequest(model="nobody/nothing"))
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


def test_list_models_names_the_demo_and_configured_models(stub) -> None:
    models = {model.id: model for model in stub.ListModels(inference_pb2.ListModelsRequest()).models}
    assert MINILM in models and MODEL in models
    assert models[MINILM].dims == 384
    assert list(models[MINILM].output_types) == ["dense"]


def test_beyond_max_concurrent_requests_is_resource_exhausted(start_worker) -> None:
    # One slot, and a batch window long enough that the first request still holds it.
    worker = start_worker(SIE_MAX_CONCURRENT_REQUESTS="1", SIE_MAX_BATCH_WAIT_MS="3000", SIE_PRELOAD_MODELS=MODEL)
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        first: dict[str, object] = {}
        holder = threading.Thread(target=lambda: first.setdefault("response", stub.Encode(encode_request(), timeout=60)))
        holder.start()
        time.sleep(1.0)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Encode(encode_request(), timeout=60)
        holder.join()
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "SIE_MAX_CONCURRENT_REQUESTS" in raised.value.details()
        assert error_reason(raised.value) == "QUEUE_FULL"
        assert len(first["response"].results) == 1  # the admitted request was not lost
        assert len(stub.Encode(encode_request(), timeout=60).results) == 1
