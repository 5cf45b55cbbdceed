"""`dims` of 0 or less is refused by the gateway as the worker refuses it: INVALID_ARGUMENT INVALID_DIMS with the
same ErrorInfo, before the answer-size estimate reads the dims. Before, `dims: 0` of a model whose config states wide
dims was answered RESOURCE_EXHAUSTED RESPONSE_TOO_LARGE (HTTP 429, which invites retries) and negative dims went on
to a worker. Over direct gRPC (gateway and worker alike) and HTTP/JSON through Envoy."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from google.protobuf import struct_pb2

from edge_helpers import ADMIN_TOKEN, MEAN, curl
from grpc_helpers import error_info
from local_cluster import model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2

# The tiny model's weights under a config that states dims so wide that 8 items' vectors alone would take 128 MB,
# over the gateway's 64 MiB answer limit: the gateway's estimate refuses such an encode before dispatch.
WIDE = "test/tiny-mean-stated-wide"
WIDE_DIMS = 4_000_000
ITEMS = 8
BAD_DIMS = (0, -3)


@pytest.fixture(scope="module")
def wide(edge, tiny_models) -> str:
    credentials = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    with grpc.insecure_channel(edge.cluster.config.address) as channel:
        config = model_config(WIDE, tiny_models[MEAN], dims=WIDE_DIMS)
        config_pb2_grpc.ConfigServiceStub(channel).AddModel(config_pb2.AddModelRequest(config=config), metadata=credentials, timeout=30)
    with grpc.insecure_channel(edge.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        listed = inference_pb2.ListModelsRequest()
        wait_until(lambda: WIDE in {model.id for model in stub.ListModels(listed, timeout=10).models}, what="the gateway to know the wide model")
    return WIDE


def encode(model: str, dims: int) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=f"x{i}") for i in range(ITEMS)], dims=dims)


def refusal(address: str, method: str, request: object) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as raised:
            getattr(inference_pb2_grpc.InferenceStub(channel), method)(request, timeout=60)
    return raised.value


def worker_encodes(edge) -> float:
    """Encode requests the edge's worker answered, whatever their model and status."""
    worker = next(process for process in edge.cluster.processes if "edge-worker" in str(process.log_path))
    total = 0.0
    with urllib.request.urlopen(f"{worker.metrics_url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("sie_worker_requests_total{") and 'operation="encode"' in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("model", [WIDE, MEAN], ids=["config states wide dims", "config states no dims"])
@pytest.mark.parametrize("dims", BAD_DIMS)
def test_the_gateway_refuses_dims_below_one_as_the_worker_does_and_sends_nothing_on(edge, wide, model, dims, reliability_report) -> None:
    worker = next(process for process in edge.cluster.processes if "edge-worker" in str(process.log_path))
    before = worker_encodes(edge)
    at_gateway = refusal(edge.gateway.address, "Encode", encode(model, dims))
    status, body = curl(edge, "POST", f"/v1/encode/{model}", {"items": [{"text": f"x{i}"} for i in range(ITEMS)], "dims": dims})
    reliability_report.add("edge", f"dims {dims}, {model}", status=at_gateway.code().name, reason=error_info(at_gateway).reason, http=status)
    assert at_gateway.code() == grpc.StatusCode.INVALID_ARGUMENT, at_gateway.details()
    assert error_info(at_gateway).reason == "INVALID_DIMS"
    assert at_gateway.details() == f"dims must be positive, got {dims}"
    assert status == 400 and body["details"][0]["reason"] == "INVALID_DIMS", body
    # The worker's own refusal, asked directly: the same status, message and ErrorInfo.
    at_worker = refusal(worker.address, "Encode", encode(model, dims))
    assert (at_worker.code(), at_worker.details()) == (at_gateway.code(), at_gateway.details())
    assert error_info(at_worker) == error_info(at_gateway)
    # Only the direct call reached the worker: the gateway sent neither of its refusals on.
    wait_until(lambda: worker_encodes(edge) >= before + 1, what="the worker to count its refusal")
    assert worker_encodes(edge) == before + 1
    assert body["details"][0]["metadata"] == dict(error_info(at_worker).metadata) == {"field": "dims"}


@pytest.mark.parametrize("dims", BAD_DIMS)
def test_openai_dimensions_below_one_are_named_in_openais_words(edge, wide, dims) -> None:
    request = inference_pb2.CreateEmbeddingsRequest(model=WIDE, input=struct_pb2.Value(string_value="x"), dimensions=dims)
    worker = next(process for process in edge.cluster.processes if "edge-worker" in str(process.log_path))
    for address in (edge.gateway.address, worker.address):
        refused = refusal(address, "CreateEmbeddings", request)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, (address, refused.details())
        assert (error_info(refused).reason, dict(error_info(refused).metadata)) == ("INVALID_DIMS", {"field": "dimensions"})
        assert refused.details() == f"dimensions must be positive, got {dims}"
    status, body = curl(edge, "POST", "/v1/embeddings", {"model": WIDE, "input": "x", "dimensions": dims})
    assert (status, body["details"][0]["reason"]) == (400, "INVALID_DIMS"), body


def test_positive_dims_still_answer_truncated_vectors(edge, wide) -> None:
    """The check refuses only what the worker refuses: dims 8 of the tiny model answer 8 values."""
    with grpc.insecure_channel(edge.gateway.address) as channel:
        answer = inference_pb2_grpc.InferenceStub(channel).Encode(encode(MEAN, 8), timeout=60)
    assert [list(result.dense.shape) for result in answer.results] == [[8]] * ITEMS
