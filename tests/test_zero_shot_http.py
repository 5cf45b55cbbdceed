"""Zero-shot classification over the edge: HTTP/JSON through Envoy and the gateway, and the SDK through Envoy's
port, answer the classifications the gateway's gRPC answers. An image sent to a text-only extractor is refused
over HTTP with status 400 (INPUT_NOT_SUPPORTED)."""

from __future__ import annotations

import base64
import io

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2
from PIL import Image

from grpc_helpers import call_until_loaded
from local_cluster import model_config, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import SIEClient
from edge_helpers import ADMIN_TOKEN, NER, Edge, curl
from test_zero_shot import LABELS, TEXTS
from tiny_families import build_tiny_nli

ZERO_SHOT = "test/zero-shot-nli"
OPTIONS = {"multi_label": True, "hypothesis_template": "This text is about {}."}


@pytest.fixture(scope="module")
def zero_shot_edge(tmp_path_factory, edge: Edge) -> Edge:
    """The shared edge with the zero-shot model added."""
    weights = build_tiny_nli(tmp_path_factory.mktemp("zero-shot-edge") / "nli")
    config = model_config(ZERO_SHOT, weights, adapter="nli_zero_shot", tasks=["extract"])
    status, body = curl(edge, "POST", "/v1/configs/models", config, {"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200, body
    return edge


def _grpc_answer(edge: Edge) -> list[list[tuple[str, float]]]:
    options = struct_pb2.Struct()
    options.update(OPTIONS)
    request = inference_pb2.ExtractRequest(
        model=ZERO_SHOT, items=[types_pb2.Item(text=text) for text in TEXTS], labels=LABELS, options=options
    )
    with grpc.insecure_channel(edge.gateway.address) as channel:
        response, _ = call_until_loaded(lambda: inference_pb2_grpc.InferenceStub(channel).Extract(request, timeout=60))
    return [[(found.label, found.score) for found in result.classifications] for result in response.results]


def _assert_equal(served: list[list[tuple[str, float]]], expected: list[list[tuple[str, float]]]) -> None:
    assert [[label for label, _ in found] for found in served] == [[label for label, _ in found] for found in expected]
    np.testing.assert_allclose(
        [score for found in served for _, score in found],
        [score for found in expected for _, score in found],
        atol=1e-6,
    )


def test_classifications_over_http_and_the_sdk_equal_grpcs(zero_shot_edge) -> None:
    items = [{"id": str(index), "text": text} for index, text in enumerate(TEXTS)]
    body = {"items": items, "labels": LABELS, "options": OPTIONS}
    wait_until(
        lambda: curl(zero_shot_edge, "POST", f"/v1/extract/{ZERO_SHOT}", body)[0] == 200, timeout_s=90, what="model served"
    )
    expected = _grpc_answer(zero_shot_edge)
    assert all(len(found) == len(LABELS) for found in expected)
    for request in (body, {"items": items, "params": {"labels": LABELS, "options": OPTIONS}}):  # the reference's shape
        status, answer = curl(zero_shot_edge, "POST", f"/v1/extract/{ZERO_SHOT}", request)
        assert status == 200, answer
        assert [result["id"] for result in answer["results"]] == [item["id"] for item in items]
        _assert_equal(
            [[(c["label"], c["score"]) for c in result["classifications"]] for result in answer["results"]], expected
        )
    with SIEClient(zero_shot_edge.base) as client:  # gRPC through Envoy's port
        results = client.extract(ZERO_SHOT, list(TEXTS), labels=LABELS, options=OPTIONS)
    _assert_equal([[(c["label"], c["score"]) for c in result["classifications"]] for result in results], expected)


def test_an_image_to_a_text_only_extractor_is_refused_over_http(zero_shot_edge) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="PNG")
    item = {"id": "img", "images": [{"data": base64.b64encode(buffer.getvalue()).decode(), "format": "png"}]}
    for model, labels in ((NER, []), (ZERO_SHOT, LABELS)):
        status, body = curl(zero_shot_edge, "POST", f"/v1/extract/{model}", {"items": [item], "labels": labels})
        assert status == 400, body
        assert body["details"][0]["reason"] == "INPUT_NOT_SUPPORTED", body
