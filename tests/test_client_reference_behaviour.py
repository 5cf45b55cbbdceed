"""sie_client behaves as the reference SDK (sie-sdk 0.10.1) where a user of it would notice: the helpers give the
same answers and errors (run side by side with the reference's in its own venv), items are dicts, errors are the
reference's classes with its attributes, results carry the reference's keys and formats (states, profiles, ids,
`model`, relations, boxes, pools, capacity), "model@profile" and gpu="pool/profile" address as they do there, and
what this engine cannot do is a NotSupportedError before anything is sent; against a real worker where it needs one."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from conftest import MISCONFIGURED_MODEL
from reference_sdk import reference_python
from reference_sdk_cases import outcomes
from sie.v1 import inference_pb2
from sie_client import (
    InputTooLongError,
    Item,
    ModelLoadFailedError,
    NotFoundError,
    NotSupportedError,
    PoolError,
    ProvisioningError,
    RateLimitError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEClient,
    SIEConnectionError,
    SIEError,
    messages,
)
from sie_client.status import CallStatus
from sie_client.verbs import model_and_profile
from test_http_edge import MEAN, NER

CASES = Path(__file__).parent / "reference_sdk_cases.py"


# --- the same answers as the reference's own helpers --------------------------------------------------------------


@pytest.mark.process  # starts the reference SDK's own Python
def test_helpers_answer_as_the_reference_s() -> None:
    python, why_not = reference_python()
    if python is None:
        pytest.skip(why_not)
    theirs = json.loads(
        subprocess.run([python, str(CASES), "sie_sdk"], capture_output=True, text=True, check=True).stdout
    )
    mine = json.loads(json.dumps(outcomes("sie_client"), sort_keys=True))
    assert len(theirs) > 20
    assert {name: mine[name] for name in theirs if mine[name] != theirs[name]} == {}
    assert theirs["maxsim no tokens"] == {"raises": "ValueError"}  # errors are compared too, not only values


def test_item_is_a_dict() -> None:
    item = Item(id="a", text="hello")
    assert item == {"id": "a", "text": "hello"} and type(item) is dict
    assert item["text"] == "hello" and item.get("images") is None and json.loads(json.dumps(item)) == item


# --- errors ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "reason", "metadata", "classes", "status_code"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "TEXT_TOO_LONG", {}, (InputTooLongError, RequestError), 400),
        (grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND", {}, (NotFoundError, RequestError), 404),
        (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_LOAD_FAILED", {}, (ModelLoadFailedError, ServerError), 400),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL", {}, (ResourceExhaustedError, ServerError), 429),
        (grpc.StatusCode.UNAVAILABLE, "PROVISIONING", {"machine_profile": "l4"}, (ProvisioningError,), 503),
        (grpc.StatusCode.UNAVAILABLE, "", {}, (SIEConnectionError,), 503),
        (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", {}, (ServerError,), 503),
        (grpc.StatusCode.NOT_FOUND, "POOL_NOT_FOUND", {"pool": "p"}, (PoolError, NotFoundError), 404),
        (grpc.StatusCode.INTERNAL, "", {}, (ServerError,), 500),
    ],
)
def test_an_answer_is_the_reference_s_class_with_its_attributes(code, reason, metadata, classes, status_code) -> None:
    error = CallStatus(code, "the message", reason, metadata, retry_after_s=1.5).error()
    assert all(isinstance(error, cls) for cls in classes)
    assert (error.code, error.status_code, error.grpc_code, error.reason) == (reason or None, status_code, code, reason)
    assert error.metadata == metadata and str(error).startswith("the message")
    assert not isinstance(error, RequestError) or not isinstance(error, ServerError)  # never both, as there
    if isinstance(error, ProvisioningError):
        assert (error.gpu, error.retry_after) == ("l4", 1.5)
    if isinstance(error, PoolError):
        assert error.pool_name == "p"


def test_the_reference_s_constructors_work() -> None:
    assert str(SIEError("plain")) == "plain"
    refused = RequestError("bad", "INVALID_INPUT", 400, param="items")
    assert (refused.code, refused.status_code, refused.param) == ("INVALID_INPUT", 400, "items")
    limited = RateLimitError("slow down", retry_after=2.0)
    assert (limited.code, limited.status_code, limited.retry_after) == ("RATE_LIMIT", 429, 2.0)
    assert InputTooLongError("long", model="m").code == "INPUT_TOO_LONG"
    assert (ModelLoadFailedError("x", permanent=False).status_code, ModelLoadFailedError("x").permanent) == (502, True)


# --- addressing ------------------------------------------------------------------------------------------------


def test_model_at_profile() -> None:
    assert model_and_profile("BAAI/bge-m3@fast", None) == ("BAAI/bge-m3", "fast")
    assert model_and_profile("BAAI/bge-m3@fast", "fast") == ("BAAI/bge-m3", "fast")
    assert model_and_profile("BAAI/bge-m3", "fast") == ("BAAI/bge-m3", "fast")
    with pytest.raises(ValueError, match="give one"):
        model_and_profile("BAAI/bge-m3@fast", "slow")


async def test_gpu_pool_slash_profile_routes_to_the_pool() -> None:
    from sie_client import AsyncSIEClient

    async with AsyncSIEClient("localhost:1", api_key="k", gpu="l4") as client:
        assert client._routing() == (("authorization", "Bearer k"), ("x-sie-machine-profile", "l4"))
        assert client._routing("eval/a100") == (
            ("authorization", "Bearer k"),
            ("x-sie-machine-profile", "a100"),
            ("x-sie-pool", "eval"),
        )
        with pytest.raises(ValueError, match="names pool 'eval'"):
            client._routing("eval/a100", "other")


# --- construction ----------------------------------------------------------------------------------------------


def test_timeouts_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with SIEClient("localhost:1") as client:
        assert (client._client.connect_timeout_s, client._client.timeout_s) == (10.0, 150.0)
    with SIEClient("localhost:1", timeout_s=5, read_timeout_s=30) as client:
        assert (client._client.connect_timeout_s, client._client.timeout_s) == (5, 30)
    monkeypatch.setenv("SIE_BASE_URL", "http://localhost:9")
    monkeypatch.setenv("SIE_API_KEY", "from-env")
    with SIEClient() as client:
        assert client.base_url == "http://localhost:9" and ("authorization", "Bearer from-env") in client._client._auth
    with SIEClient("http://elsewhere:9") as client:  # the key goes only to SIE_BASE_URL's server
        assert client._client._auth == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"http_client": object()}, NotSupportedError, "http_client"),
        ({"remote": "allow"}, ValueError, "remote"),
        ({"base_url_headers": {"x-tenant": "a"}}, ValueError, "TLS"),
        ({"base_url": "https://h:1", "base_url_headers": {"x tenant": "a"}}, ValueError, "not a header"),
        ({"base_url": "https://h:1", "base_url_headers": {"Authorization": "x"}}, ValueError, "not a header"),
        ({"base_url": "https://h:1", "base_url_headers": {"x-tenant": "a\r\nx-evil: 1"}}, ValueError, "printable"),
        ({"max_concurrency": 0}, ValueError, "max_concurrency"),
        ({"pool": {"gpus": {"l4": 1}}}, ValueError, "names its pool"),
        ({"connect_timeout_s": float("nan")}, ValueError, "connect_timeout_s"),
    ],
)
def test_arguments_this_engine_cannot_honour_are_refused(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        SIEClient(**{"base_url": "localhost:1", **kwargs})


def test_features_beyond_the_engine_are_not_supported_errors() -> None:
    with SIEClient("localhost:1") as client:
        for call, message in (
            (client.watch, "no status stream"),
            (lambda: client.get_capacity(gpu="l4"), "machine profile"),
            (lambda: client.wait_for_capacity("l4"), "without model"),
            (lambda: client.extract(NER, "x", output_schema={"type": "object"}), "output_schema"),
            (lambda: client.create_pool("p", {"l4": 1}, gpu_caps={"l4": 2}), "gpu_caps"),
            (lambda: client.create_pool("p", {"l4": 1}, minimum_worker_count=1), "minimum_worker_count"),
        ):
            with pytest.raises(NotSupportedError, match=message) as refused:
                call()
            assert isinstance(refused.value, NotImplementedError)


def test_connect_timeout_ends_a_call_to_a_peer_that_never_answers() -> None:
    """A peer that accepts TCP but never speaks HTTP/2: the call ends after connect_timeout_s, not read_timeout_s."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with SIEClient(address, connect_timeout_s=1.0, read_timeout_s=60) as client:
            started = time.monotonic()
            with pytest.raises(SIEConnectionError, match=r"connect_timeout_s=1\.0"):
                client.list_models()
            assert time.monotonic() - started < 15


# --- results: conversions of the server's messages -------------------------------------------------------------


def test_relations_and_objects_have_the_reference_s_format() -> None:
    head = inference_pb2.Entity(text="Ada", label="person", score=0.9, start=0, end=3)
    tail = inference_pb2.Entity(text="London", label="city", score=0.8, start=12, end=18)
    found = inference_pb2.ExtractResult(
        relations=[inference_pb2.Relation(head=head, tail=tail, label="lives in", score=0.7)],
        objects=[
            inference_pb2.DetectedObject(
                label="cat", score=0.5, box=inference_pb2.Box(x_min=10.4, y_min=20.6, x_max=110.2, y_max=70.7)
            )
        ],
    )
    result = messages.extract_results(inference_pb2.ExtractResponse(model="m", results=[found, found]), first_index=5)
    relation, detected = result[0]["relations"][0], result[0]["objects"][0]
    assert {key: relation[key] for key in ("head", "tail", "relation")} == {
        "head": "Ada",
        "tail": "London",
        "relation": "lives in",
    }
    assert relation["head_entity"]["start"] == 0 and relation["tail_entity"]["end"] == 18
    assert detected["bbox"] == [10, 21, 100, 50]  # x, y, width, height
    assert detected["box"]["x_max"] == pytest.approx(110.2)
    assert [r["id"] for r in result] == ["item-5", "item-6"] and result[0]["model"] == "m"


def test_models_and_pools_have_the_reference_s_shape() -> None:
    failed = inference_pb2.Model(
        id="m",
        output_types=["dense", "sparse"],
        dims=8,
        profiles=["default", "fast"],
        state=inference_pb2.MODEL_STATE_FAILED,
        failure=inference_pb2.ModelLoadFailure(error="no weights", attempts=3, permanent=True),
    )
    info = messages.model_info(failed)
    assert (info["state"], info["loaded"], info["dims"]) == ("failed", False, {"dense": 8})
    assert info["profiles"] == {"default": {"is_default": True}, "fast": {"is_default": False}}
    assert info["last_error"] == {"code": "UNKNOWN", "message": "no weights", "attempts": 3, "permanent": True}
    assert info["output_types"] == ["dense", "sparse"]  # the server's own fields stay, under their names
    assert (
        messages.model_info(inference_pb2.Model(id="m", state=inference_pb2.MODEL_STATE_LOADED))["last_error"] is None
    )
    pool = messages.pool_info(inference_pb2.Pool(name="p", gpus={"l4": 2}, workers=["w1"], bundle="b"))
    assert pool["spec"] == {"name": "p", "gpus": {"l4": 2}, "bundle": "b"}
    assert pool["status"] == {
        "state": "pending",
        "assigned_workers": [{"name": "w1", "url": "", "gpu": "", "bundle": "b"}],
    }
    assert pool["workers"] == ["w1"]


# --- against a worker ------------------------------------------------------------------------------------------


@pytest.fixture
def client(worker):
    with SIEClient(worker.address, stream_batch_size=2) as client:
        yield client


def test_results_carry_model_and_the_ids_score_gives(client) -> None:
    encoded = client.encode(MEAN, [Item(id="a", text="x"), "y", {"text": "z"}, "w", Item(id="e", text="v")])
    assert [r["id"] for r in encoded] == ["a", "item-1", "item-2", "item-3", "e"]  # over three streamed requests
    assert {r["model"] for r in encoded} == {MEAN}
    scored = client.score("test/tiny-reranker", "q", ["one", Item(id="b", text="two")])
    assert sorted(s["item_id"] for s in scored["scores"]) == ["b", "item-0"]
    # The reference's usage block: the tokens the cross-encoder read ([CLS] q [SEP] word [SEP] per pair), no images.
    assert scored["usage"] == {"input_tokens": 2 * 5}
    extracted = client.extract(NER, ["Ada Lovelace", "Alan Turing", "Grace Hopper"])
    assert [r["id"] for r in extracted] == ["item-0", "item-1", "item-2"] and extracted[0]["model"] == NER


def test_model_at_profile_addresses_the_profile(client) -> None:
    np.testing.assert_array_equal(client.encode(f"{MEAN}@default", "x")["dense"], client.encode(MEAN, "x")["dense"])
    with pytest.raises(NotFoundError) as missing:
        client.encode(f"{MEAN}@no-such-profile", "x")
    assert missing.value.reason == "PROFILE_NOT_FOUND"
    assert client.get_model(f"{MEAN}@default")["name"] == MEAN


def test_listed_models_have_reference_states_and_profiles(client) -> None:
    client.encode(MEAN, "load it")
    with pytest.raises(ModelLoadFailedError):
        client.score(MISCONFIGURED_MODEL, "q", ["x"])
    models = {model["name"]: model for model in client.list_models()}
    assert (models[MEAN]["state"], models[MEAN]["loaded"], models[MEAN]["last_error"]) == ("loaded", True, None)
    assert models[MEAN]["profiles"]["default"] == {"is_default": True}
    assert models[MISCONFIGURED_MODEL]["state"] == "failed" and models[MISCONFIGURED_MODEL]["last_error"]["message"]


def test_capacity_of_a_worker_has_the_reference_s_shape(client) -> None:
    client.encode(MEAN, "load it")
    capacity = client.get_capacity()
    assert (capacity["status"], capacity["worker_count"], capacity["gpu_count"]) == ("healthy", 1, 1)
    assert capacity["models_loaded"] == sum(1 for model in client.list_models() if model["loaded"]) >= 1
    assert MEAN in capacity["workers"][0]["loaded_models"] and capacity["models"][MEAN]["state"] == "loaded"


def test_a_short_answer_is_an_incomplete_batch_not_misaligned_results() -> None:
    from sie_client import IncompleteBatchError
    from sie_client.verbs import _check_count

    _check_count([{"id": "a"}], 1, "m", "encode")
    with pytest.raises(IncompleteBatchError) as short:
        _check_count([{"id": "a"}], 2, "m", "extract")
    assert (short.value.expected, short.value.received, short.value.code) == (2, 1, "EXTRACT_RESULT_COUNT_MISMATCH")
    assert isinstance(short.value, ServerError) and short.value.results == [{"id": "a"}]


def test_max_concurrency_serves_every_call(worker) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with SIEClient(worker.address, max_concurrency=1, stream_batch_size=2) as client, ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(client.encode, MEAN, [f"text {n}", f"more {n}", f"last {n}"]) for n in range(4)]
        assert [len(call.result(timeout=120)) for call in calls] == [3, 3, 3, 3]
