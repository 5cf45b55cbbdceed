"""The HTTP/JSON edge: curl through Envoy to the gateway and the config service, native gRPC on the same port."""

from __future__ import annotations

import json
import subprocess

import grpc
import numpy as np
import pytest

from google.protobuf import struct_pb2

from grpc_helpers import error_reason
from local_cluster import model_config, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess
from worker_process import free_port

# Other modules still import the edge's helpers from here (running_edge: edge_helpers.py).
from edge_helpers import ADMIN_TOKEN, CLIP, MEAN, NER, RERANKER, SPLADE, Edge, curl, running_edge  # noqa: F401


def test_encode_over_http_has_plain_number_vectors(edge) -> None:
    status, body = curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [{"id": "a", "text": "hello over http"}], "request_id": "r1"})
    assert status == 200, body
    dense = body["results"][0]["dense"]
    assert body["request_id"] == "r1" and body["results"][0]["id"] == "a"
    assert dense["dtype"] == "float32" and dense["shape"] == [32] and len(dense["values"]) == 32
    assert not dense.get("data")
    with grpc.insecure_channel(edge.gateway.address) as channel:
        reference = inference_pb2_grpc.InferenceStub(channel).Encode(
            inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="hello over http")])
        )
    np.testing.assert_allclose(dense["values"], from_tensor(reference.results[0].dense), atol=1e-6)
    assert set(body["timing"]) >= {"queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms", "total_ms"}


def test_native_grpc_through_the_same_port_keeps_packed_bytes(edge) -> None:
    with grpc.insecure_channel(edge.address) as channel:
        reply = inference_pb2_grpc.InferenceStub(channel).Encode(
            inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="native grpc via envoy")]), timeout=30
        )
    assert reply.results[0].dense.data and not reply.results[0].dense.values
    assert from_tensor(reply.results[0].dense).shape == (32,)


def test_score_and_extract_over_http(edge) -> None:
    status, body = curl(edge, "POST", f"/v1/score/{RERANKER}", {
        "query": {"text": "what is a vector database"},
        "items": [{"id": "x", "text": "a database for vectors"}, {"id": "y", "text": "bananas are yellow"}],
    })
    assert status == 200, body
    assert sorted(entry["item_id"] for entry in body["scores"]) == ["x", "y"]
    assert [entry["rank"] for entry in body["scores"]] == [0, 1]
    assert body["scores"][0]["score"] >= body["scores"][1]["score"]
    status, body = curl(edge, "POST", f"/v1/extract/{NER}", {"items": [{"id": "d", "text": "Ada Lovelace lived in London"}]})
    assert status == 200, body
    assert body["results"][0]["id"] == "d"
    text = "Ada Lovelace lived in London"
    for entity in body["results"][0]["entities"]:
        assert text[entity["start"]:entity["end"]] == entity["text"]


def test_images_over_http_as_base64(edge) -> None:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.arange(40 * 30 * 3, dtype=np.uint8).reshape(30, 40, 3)).save(buffer, format="PNG")
    png = buffer.getvalue()
    items = [{"id": "img", "images": [{"data": base64.b64encode(png).decode(), "format": "png"}]}, {"id": "t", "text": "a picture"}]
    status, body = curl(edge, "POST", f"/v1/encode/{CLIP}", {"items": items})
    assert status == 200, body
    assert [result["id"] for result in body["results"]] == ["img", "t"]
    with grpc.insecure_channel(edge.gateway.address) as channel:
        reference = inference_pb2_grpc.InferenceStub(channel).Encode(
            inference_pb2.EncodeRequest(model=CLIP, items=[types_pb2.Item(images=[types_pb2.Image(data=png)]), types_pb2.Item(text="a picture")])
        )
    for served, expected in zip(body["results"], reference.results):
        np.testing.assert_allclose(served["dense"]["values"], from_tensor(expected.dense), atol=1e-6)

    bad = [{"id": "junk", "images": [{"data": base64.b64encode(b"not an image").decode()}]}]
    status, body = curl(edge, "POST", f"/v1/encode/{CLIP}", {"items": bad})
    assert status == 400 and body["details"][0]["reason"] == "INVALID_IMAGE" and "items[0] (id 'junk')" in body["message"]


def test_models_over_http(edge) -> None:
    status, body = curl(edge, "GET", "/v1/models")
    assert status == 200 and {MEAN, RERANKER, NER} <= {m["id"] for m in body["models"]}
    status, body = curl(edge, "GET", f"/v1/models/{MEAN}")
    # The model object itself, as the reference API answers (gRPC's GetModelResponse wraps it).
    assert status == 200 and body["id"] == MEAN and body["loaded_on"] == ["edge-worker"] and "model" not in body


def test_config_write_needs_the_admin_token(edge, tiny_models) -> None:
    config = model_config("test/added-over-http", tiny_models[MEAN])
    assert curl(edge, "POST", "/v1/configs/models", config)[0] == 401
    assert curl(edge, "POST", "/v1/configs/models", config, {"authorization": "Bearer wrong"})[0] == 403
    status, body = curl(edge, "POST", "/v1/configs/models", config, {"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200 and body["created"] is True
    status, epoch = curl(edge, "GET", "/v1/configs/epoch")
    assert status == 200 and int(epoch["epoch"]) >= int(body["epoch"])
    # Reading configs back needs the admin token too.
    assert curl(edge, "GET", "/v1/configs/models/test/added-over-http")[0] == 401
    status, got = curl(edge, "GET", "/v1/configs/models/test/added-over-http", None, {"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert status == 200 and got["config"]["id"] == "test/added-over-http"
    # ...and the gateway serves it, without a restart.
    wait_until(lambda: curl(edge, "POST", "/v1/encode/test/added-over-http", {"items": [{"text": "new"}]})[0] == 200, timeout_s=60, what="new model served")


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "reason"),
    [
        (f"/v1/encode/{MEAN}", {"items": []}, {}, 400, "NO_ITEMS"),
        ("/v1/encode/no/such-model", {"items": [{"text": "x"}]}, {}, 404, "MODEL_NOT_FOUND"),
        (f"/v1/encode/{MEAN}", {"items": [{"text": "x"}]}, {"x-sie-machine-profile": "l4"}, 503, "PROVISIONING"),
        (f"/v1/encode/{MEAN}", {"items": [{"text": "x"}]}, {"x-sie-machine-profile": "tpu"}, 400, "UNKNOWN_MACHINE_PROFILE"),
        (f"/v1/encode/{MEAN}", {"items": [{"text": "x"}], "output_dtype": "float64"}, {}, 400, "UNKNOWN_OUTPUT_DTYPE"),
        (f"/v1/encode/{MEAN}", '{"items": "not a list"}', {}, 400, None),
    ],
    ids=["invalid-argument", "not-found", "unavailable", "failed-precondition", "bad-dtype", "wrong-json-type"],
)
def test_errors_map_to_http_statuses_with_a_json_body(edge, path, body, headers, status, reason) -> None:
    got_status, got = curl(edge, "POST", path, body, headers)
    assert got_status == status, got
    if reason is not None:
        assert got["message"]
        infos = [d for d in got.get("details", []) if d.get("@type", "").endswith("google.rpc.ErrorInfo")]
        assert infos and infos[0]["reason"] == reason


def test_the_openai_client_gets_the_sdks_embeddings(edge) -> None:
    from openai import OpenAI

    from sie_client import SIEClient

    texts = ["the openai client", "talks to envoy", "ünïcödé too"]
    openai = OpenAI(base_url=f"{edge.base}/v1", api_key="not-checked")
    answer = openai.embeddings.create(model=MEAN, input=texts)  # the client asks for base64
    with SIEClient(edge.gateway.address) as client:
        expected = [result["dense"] for result in client.encode(MEAN, texts)]
    assert [item.index for item in answer.data] == [0, 1, 2]
    for item, vector in zip(answer.data, expected):
        np.testing.assert_allclose(item.embedding, vector, atol=1e-6)
    assert answer.model == MEAN
    assert answer.usage.prompt_tokens == answer.usage.total_tokens > len(texts)
    short = openai.embeddings.create(model=MEAN, input="one text", dimensions=8)
    assert len(short.data[0].embedding) == 8


def test_embeddings_over_curl_as_floats_with_real_token_counts(edge) -> None:
    status, body = curl(edge, "POST", "/v1/embeddings", {"model": MEAN, "input": "hello world", "encoding_format": "float"})
    assert status == 200, body
    assert body["object"] == "list" and body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    assert len(body["data"][0]["embedding"]) == 32
    # [CLS] passage: hello world [SEP] -> the tiny models' document prompt is counted too.
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == 6
    status, body = curl(edge, "POST", "/v1/embeddings", {"model": MEAN, "input": [1, 2, 3]})
    assert status == 400 and "token arrays" in body["message"]
    status, body = curl(edge, "POST", "/v1/embeddings", {"model": MEAN, "input": "x", "encoding_format": "hex"})
    assert status == 400 and "encoding_format" in body["message"]


def test_a_model_added_with_grpcurl_is_served_without_a_restart(edge, tiny_models) -> None:
    from test_grpcurl import GRPCURL

    body = json.dumps({"config": model_config("test/added-with-grpcurl", tiny_models[MEAN])})
    added = subprocess.run(
        [GRPCURL, "-plaintext", "-H", f"authorization: Bearer {ADMIN_TOKEN}", "-d", body, edge.cluster.config.address,
         "sie.v1.ConfigService/AddModel"],
        capture_output=True, text=True, timeout=60,
    )
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["created"] is True
    wait_until(
        lambda: curl(edge, "POST", "/v1/encode/test/added-with-grpcurl", {"items": [{"text": "hi"}]})[0] == 200,
        timeout_s=60, what="the added model served through the gateway",
    )


# --- the reference API's request shapes ---------------------------------------------------------


def grpc_encode(edge: Edge, **fields) -> inference_pb2.EncodeResponse:
    with grpc.insecure_channel(edge.gateway.address) as channel:
        return inference_pb2_grpc.InferenceStub(channel).Encode(inference_pb2.EncodeRequest(model=MEAN, **fields), timeout=30)


def test_a_query_is_embedded_as_a_query_three_ways(edge) -> None:
    """gRPC `is_query`, gRPC `options.is_query` and the HTTP `params` shape: the query vector, not the document's."""
    texts = [types_pb2.Item(id="q", text="what is a vector database")]
    options = struct_pb2.Struct()
    options.update({"is_query": True})
    document = from_tensor(grpc_encode(edge, items=texts).results[0].dense)
    by_field = from_tensor(grpc_encode(edge, items=texts, is_query=True).results[0].dense)
    by_option = from_tensor(grpc_encode(edge, items=texts, options=options).results[0].dense)
    status, body = curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [{"id": "q", "text": "what is a vector database"}], "params": {"is_query": True}})
    assert status == 200, body
    by_params = np.array(body["results"][0]["dense"]["values"], dtype=np.float32)
    assert np.abs(by_field - document).max() > 1e-3, "the tiny model's query prompt should change the vector"
    np.testing.assert_array_equal(by_option, by_field)
    np.testing.assert_allclose(by_params, by_field, atol=1e-6)


def test_an_encode_naming_no_output_type_gets_the_models_own_output_over_http(edge) -> None:
    """Through Envoy and the gateway: a sparse-only model answers sparse, not INVALID_ARGUMENT for dense."""
    status, body = curl(edge, "POST", f"/v1/encode/{SPLADE}", {"items": [{"text": "sparse words"}]})
    assert status == 200, body
    result = body["results"][0]
    assert result["sparse"]["indices"] and not result.get("dense")
    status, body = curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [{"text": "dense words"}]})
    assert status == 200, body
    assert len(body["results"][0]["dense"]["values"]) == 32 and not body["results"][0].get("sparse")


def test_the_reference_body_shape_answers_as_grpc_does(edge) -> None:
    status, body = curl(edge, "POST", f"/v1/encode/{SPLADE}", {"items": [{"text": "sparse words"}], "params": {"output_types": ["sparse"]}})
    assert status == 200, body
    sparse = body["results"][0]["sparse"]
    assert sparse["indices"] and not body["results"][0].get("dense")
    with grpc.insecure_channel(edge.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        expected = stub.Encode(inference_pb2.EncodeRequest(model=SPLADE, items=[types_pb2.Item(text="sparse words")], output_types=["sparse"]), timeout=30)
        assert [int(i) for i in sparse["indices"]] == list(expected.results[0].sparse.indices)
        np.testing.assert_allclose(sparse["values"], expected.results[0].sparse.values, atol=1e-6)

        query, docs = "what is a vector database", ["a database for vectors", "bananas are yellow", "vectors in a store"]
        status, body = curl(edge, "POST", f"/v1/score/{RERANKER}", {
            "query": {"text": query}, "items": [{"id": f"d{i}", "text": d} for i, d in enumerate(docs)], "params": {"top_k": 2},
        })
        assert status == 200, body
        scored = stub.Score(inference_pb2.ScoreRequest(
            model=RERANKER, query=types_pb2.Item(text=query), items=[types_pb2.Item(id=f"d{i}", text=d) for i, d in enumerate(docs)], top_k=2,
        ), timeout=30)
        assert [(e["item_id"], e["rank"]) for e in body["scores"]] == [(e.item_id, e.rank) for e in scored.scores] and len(scored.scores) == 2
        np.testing.assert_allclose([e["score"] for e in body["scores"]], [e.score for e in scored.scores], atol=1e-6)

        text = "Ada Lovelace lived in London"
        status, body = curl(edge, "POST", f"/v1/extract/{NER}", {"items": [{"id": "d", "text": text}], "params": {"threshold": 0.0}})
        assert status == 200, body
        extracted = stub.Extract(inference_pb2.ExtractRequest(model=NER, items=[types_pb2.Item(id="d", text=text)], threshold=0.0), timeout=30)
        entities = [(e["text"], e["label"], e["start"], e["end"]) for e in body["results"][0]["entities"]]
        assert entities and entities == [(e.text, e.label, e.start, e.end) for e in extracted.results[0].entities]


@pytest.mark.parametrize(
    ("body", "field", "known"),
    [
        ({"items": [{"text": "x"}], "colour": "red"}, "colour", "output_types, output_dtype"),
        ({"items": [{"text": "x"}], "params": {"is_query": True, "query": True}}, "params.query", "instruction, is_query, dims"),
        ({"items": [{"text": "x"}, {"text": "y", "txt": "z"}]}, "items[1].txt", "id, text, images"),
    ],
    ids=["top-level", "in-params", "in-an-item"],
)
def test_an_unknown_json_field_is_refused_naming_it(edge, body, field, known) -> None:
    status, got = curl(edge, "POST", f"/v1/encode/{MEAN}", body)
    assert status == 400, got
    assert f"unknown field '{field}'" in got["message"] and known in got["message"], got["message"]
    assert got["details"][0]["reason"] == "UNKNOWN_FIELD" and got["details"][0]["metadata"] == {"field": field}


def test_a_profile_in_options_or_params_is_the_profile_through_the_gateway(edge) -> None:
    for body in ({"options": {"profile": "nope"}}, {"params": {"profile": "nope"}}, {"profile": "nope"}):
        status, got = curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [{"text": "x"}], **body})
        assert status == 404 and got["details"][0]["reason"] == "PROFILE_NOT_FOUND", (body, got)


def test_free_form_metadata_and_known_fields_in_either_spelling_pass(edge) -> None:
    """Item metadata is free-form; options are not (an option the model reads no is UNKNOWN_OPTION at the worker),
    but an options key that stands for a parameter passes in either place."""
    item = {"text": "x", "metadata": {"any": {"nested": [1, {"k": "v"}]}}}
    body = {"items": [item], "outputTypes": ["dense"], "options": {"is_query": True}, "params": {"options": {"is_query": True}}}
    status, got = curl(edge, "POST", f"/v1/encode/{MEAN}", body)
    assert status == 200 and len(got["results"]) == 1, got


def test_a_parameter_given_twice_differently_is_a_400_naming_both(edge) -> None:
    status, got = curl(edge, "POST", f"/v1/encode/{MEAN}", {"items": [{"text": "x"}], "is_query": True, "params": {"is_query": False}})
    assert status == 400 and got["details"][0]["reason"] == "CONFLICTING_OPTIONS"
    assert "is_query" in got["message"] and "params.is_query" in got["message"]


def test_the_gateway_bounds_a_name_given_as_an_option_before_routing(edge) -> None:
    options = struct_pb2.Struct()
    options.update({"lora": "x" * 300})
    with grpc.insecure_channel(edge.gateway.address) as channel:
        call = inference_pb2_grpc.InferenceStub(channel).Encode.with_call
        with pytest.raises(grpc.RpcError) as raised:
            call(inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")], options=options), timeout=30)
    assert error_reason(raised.value) == "NAME_TOO_LONG"
    assert "x-sie-worker" not in dict(raised.value.trailing_metadata() or ()), "refused by the gateway, before any worker"


def test_health_routes_on_the_http_port(edge) -> None:
    for path in ("/health", "/healthz"):
        assert curl(edge, "GET", path) == (200, {"status": "ok"})
    wait_until(lambda: curl(edge, "GET", "/readyz")[0] == 200, timeout_s=30, what="Envoy's health check of the gateway")


@pytest.mark.process
def test_readyz_is_503_while_the_gateway_is_unreachable(tmp_path) -> None:
    port, admin_port = free_port(), free_port()
    config_path = tmp_path / "envoy.json"
    nowhere = f"127.0.0.1:{free_port()}"
    config_path.write_text(json.dumps(render(listen_port=port, admin_port=admin_port, gateway=nowhere, config=nowhere)))
    envoy = EnvoyProcess(config_path, tmp_path / "envoy.log", admin_port)
    try:
        envoy.wait_ready()
        lonely = Edge(None, None, envoy, port)  # type: ignore[arg-type]
        assert curl(lonely, "GET", "/healthz") == (200, {"status": "ok"}), "liveness is Envoy's own"
        assert curl(lonely, "GET", "/readyz")[0] == 503
    finally:
        envoy.stop()
