"""The client takes what a user of the reference SDK writes: URLs, dict items, per-call routing, pools, capacity,
its error classes, result keys and helpers; against a real worker, and a gateway behind Envoy."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from conftest import LORA_MODEL, MISCONFIGURED_MODEL
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import (
    AsyncSIEClient,
    ItemError,
    LoraLoadingError,
    ModelLoadFailedError,
    ModelLoadingError,
    NotFoundError,
    PoolError,
    PreconditionError,
    ProvisioningError,
    ProvisioningTimeoutError,
    RequestError,
    ServerError,
    SIEAsyncClient,
    SIEClient,
    SIEConnectionError,
    dequantize,
)
from sie_client import encoding
from sie_client.scoring import maxsim
from sie_client.status import call_status
from sie_client.types import Item
from worker_process import free_port
from edge_helpers import MEAN, NER, running_edge

COLBERT = "test/tiny-colbert"


@pytest.fixture
def client(worker):
    with SIEClient(worker.address) as client:
        yield client


@pytest.fixture(scope="module")
def pools_edge(tmp_path_factory, etcd_server, tiny_models):
    """Config service, one worker (machine profile `default`), a gateway that may scale `l4` from zero and lets
    callers create pools, and Envoy in front."""
    env = {"SIE_POOLS_ENABLED": "true", "SIE_GATEWAY_PROVISIONING_RETRY_S": "0.2"}
    env |= {"SIE_POOL_SHARED_WORKERS": "0", "SIE_POOL_MAX_SHARE": "1"}  # one worker: a pool may take it
    with running_edge(tmp_path_factory.mktemp("reference-edge"), etcd_server.endpoint, tiny_models, **env) as running:
        yield running


# --- construction ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "target", "base_url"),
    [
        ("http://localhost:8080", "localhost:8080", "http://localhost:8080"),
        ("http://localhost:8080/", "localhost:8080", "http://localhost:8080"),
        ("https://sie.example.com", "sie.example.com:443", "https://sie.example.com:443"),
        ("http://[::1]:9000", "[::1]:9000", "http://[::1]:9000"),
        ("localhost:50051", "localhost:50051", "http://localhost:50051"),
        ("dns:///localhost:50051", "dns:///localhost:50051", "dns:///localhost:50051"),
        ("unix:/tmp/sie.sock", "unix:/tmp/sie.sock", "unix:/tmp/sie.sock"),
    ],
)
def test_urls_and_host_port(given: str, target: str, base_url: str) -> None:
    for client in (SIEClient(given), SIEClient(base_url=given)):
        with client:
            assert (client.target, client.base_url) == (target, base_url)


async def test_async_client_and_its_reference_name() -> None:
    assert SIEAsyncClient is AsyncSIEClient
    async with SIEAsyncClient(base_url="https://sie.example.com:8443") as client:
        assert (client.target, client.base_url) == ("sie.example.com:8443", "https://sie.example.com:8443")
    async with AsyncSIEClient("localhost:50051", tls=True) as client:
        assert client.base_url == "https://localhost:50051"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((), {}, "base_url"),
        ((), {"target": "localhost:1", "base_url": "http://localhost:1"}, "once"),
        (("ftp://localhost:1",), {}, "http:// or https://"),
        (("http://localhost:1/v1",), {}, "no path"),
        (("localhost",), {}, "host:port"),
    ],
)
def test_a_bad_target_is_a_value_error(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SIEClient(*args, **kwargs)


def test_https_means_tls(pools_edge) -> None:
    """Envoy serves plaintext here: a TLS handshake cannot succeed, so the https:// client must have tried TLS."""
    with SIEClient(f"https://{pools_edge.address}", timeout_s=5) as client, pytest.raises(SIEConnectionError):
        client.list_models()


# --- items ---------------------------------------------------------------------------------------------------


def test_dict_items_work_like_items(client) -> None:
    as_dicts = client.encode(MEAN, [{"id": "a", "text": "dict item"}, {"text": "second", "metadata": {"k": "v"}}])
    as_items = client.encode(MEAN, [Item(id="a", text="dict item"), Item(text="second")])
    assert [r["id"] for r in as_dicts] == ["a", "item-1"]  # as score names an item without an id
    np.testing.assert_allclose(np.stack([r["dense"] for r in as_dicts]), np.stack([r["dense"] for r in as_items]), atol=1e-6)
    one = client.encode(MEAN, {"id": "solo", "text": "dict item"})  # one dict in, one result out
    assert one["id"] == "solo"
    np.testing.assert_allclose(one["dense"], as_dicts[0]["dense"], atol=1e-6)


@pytest.mark.parametrize(
    ("item", "field", "message"),
    [
        ({"txt": "typo"}, "txt", "unknown item field 'txt'"),
        ({"text": "x", "audio": b"RIFF"}, "audio", "item field 'audio' is not supported"),
        ({"text": "x", "video": "clip.mp4"}, "video", "item field 'video' is not supported"),
    ],
)
def test_an_unknown_or_unsupported_item_field_is_refused_by_name(client, item: dict, field: str, message: str) -> None:
    for call in (
        lambda: client.encode(MEAN, [item]),
        lambda: client.score("test/tiny-reranker", "q", [item]),
        lambda: client.extract(NER, item),
    ):
        with pytest.raises(ItemError, match=message) as refused:
            call()
        assert isinstance(refused.value, RequestError) and isinstance(refused.value, ValueError)
        assert refused.value.reason == "INVALID_ITEM_FIELD" and refused.value.metadata == {"field": field}


# --- results -------------------------------------------------------------------------------------------------


def test_score_results_carry_query_id_and_default_item_ids(client) -> None:
    ranked = client.score("test/tiny-reranker", {"id": "q1", "text": "vector search"}, [{"id": "a", "text": "vectors"}, "bananas"])
    assert ranked["query_id"] == "q1"
    assert sorted(s["item_id"] for s in ranked["scores"]) == ["a", "item-1"]
    assert {s["item_id"]: s["index"] for s in ranked["scores"]} == {"a": 0, "item-1": 1}
    assert client.score("test/tiny-reranker", "no id", ["x"])["query_id"] is None


def test_extract_results_carry_the_reference_keys(client) -> None:
    result = client.extract(NER, {"id": "t", "text": "Ada Lovelace lived in London"})
    assert set(result) == {"model", "id", "entities", "relations", "classifications", "objects", "data", "timing"}
    assert (result["relations"], result["classifications"], result["objects"], result["data"]) == ([], [], [], {})


def test_models_carry_name_outputs_dims_and_loaded(client) -> None:
    models = {model["name"]: model for model in client.list_models()}
    assert models[MEAN]["id"] == MEAN and models[MEAN]["outputs"] == ["dense"] and models[MEAN]["loaded"] is True
    assert models[MEAN]["dims"] == {"dense": 32}
    assert models[COLBERT]["outputs"] == ["multivector", "dense"]
    assert "multivector" not in models[COLBERT]["dims"]  # the API reports the dense width only
    assert models[MISCONFIGURED_MODEL]["loaded"] is False


def test_one_item_gives_one_result_with_timing(client) -> None:
    result = client.encode(MEAN, Item(text="Hello"))
    assert {"queue_ms", "inference_ms", "total_ms"} <= set(result["timing"])
    assert result["timing"]["total_ms"] >= result["timing"]["inference_ms"] >= 0


def test_options_go_to_the_server_unchanged(client) -> None:
    by_option = client.encode(LORA_MODEL, "adapted", options={"lora": "alpha"})["dense"]
    np.testing.assert_allclose(by_option, client.encode(LORA_MODEL, "adapted", lora="alpha")["dense"], atol=1e-6)
    assert not np.allclose(by_option, client.encode(LORA_MODEL, "adapted")["dense"], atol=1e-4)
    with pytest.raises(RequestError) as disagreeing:  # the server sees both names, the client picks neither
        client.encode(LORA_MODEL, "adapted", lora="alpha", options={"lora": "beta"})
    assert disagreeing.value.reason == "CONFLICTING_OPTIONS"


# --- helpers -------------------------------------------------------------------------------------------------


def test_encoding_accessors(client) -> None:
    result = client.encode("test/tiny-splade", "sparse words here", output_types=["sparse"])
    sparse = encoding.sparse(result)
    assert sparse == {int(i): float(v) for i, v in zip(result["sparse"]["indices"], result["sparse"]["values"], strict=True)}
    assert encoding.sparse(result["sparse"]) == sparse
    unit = encoding.normalize_sparse(sparse)
    assert set(unit) == set(sparse) and encoding.sparse_dot(unit, unit) == pytest.approx(1.0, abs=1e-6)
    assert encoding.normalize_sparse({}) == {}
    with pytest.raises(KeyError, match="no dense output"):
        encoding.dense(result)

    quantized = client.encode(MEAN, "int8 row", output_dtype="int8")
    np.testing.assert_array_equal(encoding.dense(quantized), dequantize(quantized))
    assert encoding.dense(quantized).dtype == np.float32
    colbert = client.encode(COLBERT, "a document", output_types=["multivector"])
    assert encoding.multivector(colbert).shape == colbert["multivector"].shape


def test_maxsim_matches_the_servers_late_interaction_score(client) -> None:
    query, documents = "what is late interaction", ["late interaction compares tokens", "bananas are yellow"]
    q = client.encode(COLBERT, query, is_query=True, output_types=["multivector"])["multivector"]
    d = [r["multivector"] for r in client.encode(COLBERT, documents, output_types=["multivector"])]
    served = {s["index"]: s["score"] for s in client.score(COLBERT, query, documents)["scores"]}
    mine = maxsim(q, d)
    assert len(mine) == 2
    np.testing.assert_allclose(mine, [served[0], served[1]], rtol=1e-4, atol=1e-4)
    assert maxsim(q, d[0]) == pytest.approx([mine[0]], rel=1e-6)  # one document: a list of one, as the reference
    with pytest.raises(ValueError, match="tokens"):
        maxsim(q, np.zeros((3, q.shape[1] + 1), np.float32))


# --- errors: each reference class from a real answer --------------------------------------------------------


def test_model_loading_lora_loading_and_load_failures(start_worker) -> None:
    cold = start_worker(SIE_PRELOAD_MODELS="")
    with SIEClient(cold.address) as client:
        with pytest.raises(ModelLoadingError) as loading:
            client.encode(MEAN, "first request", wait_for_capacity=False)
        assert loading.value.reason == "MODEL_LOADING" and loading.value.grpc_code == grpc.StatusCode.UNAVAILABLE
        client.encode(LORA_MODEL, "load the base model")  # waits out MODEL_LOADING
        with grpc.insecure_channel(cold.address) as channel, pytest.raises(grpc.RpcError) as raw:
            inference_pb2_grpc.InferenceStub(channel).Encode(
                inference_pb2.EncodeRequest(model=LORA_MODEL, items=[types_pb2.Item(text="x")], lora="beta"), timeout=30
            )
        assert isinstance(call_status(raw.value).error(), LoraLoadingError)  # the answer a client gives up on
        with pytest.raises(ModelLoadFailedError) as failed:
            client.score(MISCONFIGURED_MODEL, "q", ["x"])
        assert failed.value.reason == "MODEL_LOAD_FAILED" and isinstance(failed.value, ServerError)  # as the reference


def test_connection_and_server_errors(client) -> None:
    with SIEClient(f"127.0.0.1:{free_port()}", timeout_s=2) as nowhere, pytest.raises(SIEConnectionError) as refused:
        nowhere.list_models()
    assert refused.value.grpc_code == grpc.StatusCode.UNAVAILABLE and refused.value.reason == ""
    with SIEClient(client.target, read_timeout_s=0.0001) as hurried, pytest.raises(ServerError) as late:
        hurried.encode(MEAN, "no time")
    assert late.value.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(RequestError) as bad:
        client.encode(MEAN, "x", output_dtype="float64")
    assert bad.value.reason == "UNKNOWN_OUTPUT_DTYPE"


# --- through Envoy: routing, provisioning, pools, capacity --------------------------------------------------


def test_gpu_per_call_routes_by_machine_profile(pools_edge) -> None:
    with SIEClient(f"http://{pools_edge.address}", gpu="l4", timeout_s=30) as client:
        assert client.encode(MEAN, "routed", gpu="default")["dense"].shape == (32,)  # the call's profile wins
        with pytest.raises(ProvisioningError) as provisioning:
            client.encode(MEAN, "no l4 worker yet", wait_for_capacity=False)  # the client's profile
        assert provisioning.value.reason == "PROVISIONING" and provisioning.value.metadata["machine_profile"] == "l4"
        assert not isinstance(provisioning.value, ProvisioningTimeoutError)
        with pytest.raises(ProvisioningTimeoutError):
            client.encode(MEAN, "waits, then gives up", provision_timeout_s=1.0)
        with pytest.raises(PreconditionError) as unknown:
            client.score("test/tiny-reranker", "q", ["x"], gpu="h100")
        assert unknown.value.reason == "UNKNOWN_MACHINE_PROFILE"


def test_pools_take_the_reference_spec_and_capacity_lists_them(pools_edge) -> None:
    with SIEClient(f"http://{pools_edge.address}", timeout_s=30) as client:
        with pytest.raises(NotFoundError) as no_bundle:
            client.create_pool("ref-pool", gpus={"default": 1}, bundle="no-such-bundle")
        assert no_bundle.value.reason == "BUNDLE_NOT_FOUND" and no_bundle.value.metadata == {"bundle": "no-such-bundle"}
        with pytest.raises(ValueError, match="min_workers"):
            client.create_pool("ref-pool", gpus={"default": 1}, min_workers=2)
        with pytest.raises(PoolError) as too_large:
            client.create_pool("ref-pool", gpus={"default": 99})
        assert isinstance(too_large.value, RequestError) and too_large.value.reason == "POOL_TOO_LARGE"
        with pytest.raises(PoolError) as missing:
            client.encode(MEAN, "x", pool="no-such-pool")
        assert isinstance(missing.value, NotFoundError) and missing.value.reason == "POOL_NOT_FOUND"
        try:
            pool = client.create_pool("ref-pool", gpus={"default": 1}, bundle="default", min_workers=1, ttl_s=30)
            assert pool["name"] == "ref-pool" and pool["workers"] == ["edge-worker"] and pool["bundle"] == "default"
            assert client.encode(MEAN, "in the pool", pool="ref-pool")["dense"].shape == (32,)
            capacity = client.get_capacity()
            assert [p["name"] for p in capacity["pools"]] == ["ref-pool"]
            assert capacity["models"][MEAN]["loaded_on"] == ["edge-worker"]
            assert "edge-worker" in [worker["name"] for worker in capacity["workers"]]
            assert client.get_pool("ref-pool")["status"]["assigned_workers"][0]["name"] == "edge-worker"
            # The worker is the pool's now: a request without the pool finds none of profile `default`.
            assert client.wait_for_capacity("ref-pool/default", model=MEAN, timeout_s=5)["models"][MEAN]["loaded"]
        finally:
            assert client.delete_pool("ref-pool") is True
        assert client.get_pool("ref-pool") is None and client.delete_pool("ref-pool") is False  # as the reference
