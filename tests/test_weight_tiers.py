"""Weight resolution order against a real S3-compatible server on loopback:
local cache hit, cluster cache hit (copied to local), upload after an origin
fetch, and a miss everywhere with the Hub fallback off."""

from __future__ import annotations

import filecmp
import os
import shutil
import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from grpc_helpers import encode_request, encode_when_loaded, error_info, retry_delay_s
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.cluster.model_config import ModelConfig, parse_model_config
from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import CLUSTER_MARKER, LOCAL_MARKER, LocalCache, weights_key
from sie_worker.weights.resolver import WeightResolver, WeightsNotFound

MODEL = "test/tiny-mean"


def config(hf_id: str, **extra):
    return parse_model_config(
        {"id": hf_id, "hf_id": hf_id, "profiles": {"default": {"adapter": "sentence_transformer"}}, **extra}, source="t.yaml"
    )


@pytest.fixture
def bucket(s3_server) -> str:
    name = f"weights-{uuid.uuid4().hex[:8]}"
    s3_server.client().create_bucket(Bucket=name)
    return name


def resolver(s3_server, bucket: str, local: Path, **settings) -> WeightResolver:
    return WeightResolver(
        WorkerSettings(
            local_cache=str(local), cluster_cache=f"s3://{bucket}/cache", s3_endpoint_url=s3_server.endpoint_url, hf_fallback=False, **settings
        )
    )


def same_files(a: Path, b: Path) -> bool:
    names = sorted(path.relative_to(a).as_posix() for path in a.rglob("*") if path.is_file())
    match, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors and len(match) == len(names) > 0


def test_origin_upload_then_cluster_hit_then_local_hit(s3_server, bucket, tiny_models, tmp_path, monkeypatch) -> None:
    # An installed package holding the weights is this model's origin (the Hub is out of reach here).
    package = tmp_path / "site" / "tiny_weights_pkg"
    shutil.copytree(tiny_models[MODEL], package / "model")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    origin_config = config("org/tiny", bundled_weights="tiny_weights_pkg:model")

    first = resolver(s3_server, bucket, tmp_path / "worker-1", weight_packages=("tiny_weights_pkg",)).resolve(origin_config)
    assert first.source == "bundled package"
    keys = [item["Key"] for item in s3_server.client().list_objects_v2(Bucket=bucket)["Contents"]]
    assert f"cache/org--tiny@main/{CLUSTER_MARKER}" in keys
    assert "cache/org--tiny@main/model.safetensors" in keys

    # Another worker, empty local cache, no package: the cluster copy lands in its local cache.
    second_worker = resolver(s3_server, bucket, tmp_path / "worker-2")
    from_cluster = second_worker.resolve(config("org/tiny"))
    assert from_cluster.source == "cluster cache"
    assert from_cluster.path == tmp_path / "worker-2" / "sie-weights" / "org--tiny@main"
    assert same_files(tiny_models[MODEL], from_cluster.path)

    # Next time it is a local hit, even with the cluster cache gone.
    s3_server.client().delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": key} for key in keys]})
    again = second_worker.resolve(config("org/tiny"))
    assert (again.source, again.path) == ("local cache", from_cluster.path)


def test_miss_everywhere_with_hub_fallback_off_lists_what_was_tried(s3_server, bucket, tmp_path) -> None:
    with pytest.raises(WeightsNotFound) as raised:
        resolver(s3_server, bucket, tmp_path).resolve(config("org/nowhere"))
    message = str(raised.value)
    assert message.startswith("no weights found for org/nowhere; tried: ")
    assert f"local cache {tmp_path / 'sie-weights'}: no org--nowhere@main" in message
    assert f"cluster cache s3://{bucket}/cache: no org--nowhere@main" in message
    assert "Hugging Face Hub: disabled (SIE_HF_FALLBACK=false)" in message
    assert not raised.value.retryable


def test_an_unreachable_cluster_cache_is_a_retryable_miss(tmp_path) -> None:
    from worker_process import free_port

    settings = WorkerSettings(
        local_cache=str(tmp_path), cluster_cache="s3://b/p", s3_endpoint_url=f"http://127.0.0.1:{free_port()}", hf_fallback=False
    )
    with pytest.raises(WeightsNotFound) as raised:
        WeightResolver(settings).resolve(config("org/nowhere"))
    assert raised.value.retryable
    assert "cluster cache s3://b/p: " in str(raised.value)


def test_disk_lru_removes_least_recently_used_weights_over_the_threshold(tmp_path) -> None:
    sizes = {"old": 40, "middle": 30, "new": 20}  # percent of a disk, 90% in all

    def disk_usage(root: Path) -> tuple[int, int]:
        return 100, sum(sizes[folder.name] for folder in root.iterdir() if folder.name in sizes)

    cache = LocalCache(tmp_path, lru_enabled=True, pressure_percent=50, disk_usage=disk_usage)
    for age, key in enumerate(sizes):
        cache.fill(key, lambda staging: staging.mkdir())
        os.utime(cache.folder(key) / LOCAL_MARKER, (1000 + age, 1000 + age))
    assert cache.lookup("old") is not None  # used again: now the most recent

    disabled = LocalCache(tmp_path, lru_enabled=False, pressure_percent=50, disk_usage=disk_usage)
    assert disabled.trim(keep=()) == []
    # "new" is in use; "middle" goes first, then "old", until the disk is at 20%.
    assert cache.trim(keep={"new"}) == ["middle", "old"]
    assert sorted(folder.name for folder in cache.root.iterdir()) == ["new"]


def test_worker_serves_from_the_cluster_cache_and_refuses_missing_weights(start_worker, s3_server, bucket, tiny_models, tmp_path) -> None:
    client = s3_server.client()
    for path in sorted(tiny_models[MODEL].rglob("*")):
        if path.is_file():
            client.upload_file(str(path), bucket, f"cache/org--tiny-cluster@main/{path.relative_to(tiny_models[MODEL]).as_posix()}")
    client.put_object(Bucket=bucket, Key=f"cache/org--tiny-cluster@main/{CLUSTER_MARKER}", Body=b"")
    configs = tmp_path / "configs"
    configs.mkdir()
    for model_id, hf_id in [("test/from-cluster", "org/tiny-cluster"), ("test/missing", "org/missing")]:
        (configs / f"{hf_id.split('/')[1]}.yaml").write_text(
            f"id: {model_id}\nhf_id: {hf_id}\nprofiles:\n  default:\n    adapter: sentence_transformer\n"
        )
    worker = start_worker(
        SIE_MODELS_DIR=str(configs),
        SIE_PRELOAD_MODELS="",
        SIE_LOCAL_CACHE=str(tmp_path / "local"),
        SIE_CLUSTER_CACHE=f"s3://{bucket}/cache",
        SIE_S3_ENDPOINT_URL=s3_server.endpoint_url,
        SIE_HF_FALLBACK="false",
    )
    texts = ["weights from the cluster cache", "second"]
    reference = SentenceTransformer(str(tiny_models[MODEL]), device="cpu").encode(texts, prompt_name="document")
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        served, loading = encode_when_loaded(stub, "test/from-cluster", texts)
        np.testing.assert_allclose(served, reference, atol=1e-5)
        assert loading >= 1
        assert (tmp_path / "local" / "sie-weights" / "org--tiny-cluster@main" / "model.safetensors").is_file()

        with pytest.raises(grpc.RpcError) as raised:
            encode_when_loaded(stub, "test/missing", texts)
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
        details = raised.value.details()
        assert "no weights found for test/missing" in details
        assert f"cluster cache s3://{bucket}/cache: no org--missing@main" in details
        assert "Hugging Face Hub: disabled (SIE_HF_FALLBACK=false)" in details

        model = stub.GetModel(inference_pb2.GetModelRequest(model="test/missing")).model
        assert model.state == inference_pb2.MODEL_STATE_FAILED
        assert (model.failure.permanent, model.failure.attempts) == (True, 1)
        assert "SIE_HF_FALLBACK=false" in model.failure.error
        # A permanent failure is not retried: the same answer again, still one attempt.
        with pytest.raises(grpc.RpcError) as again:
            stub.Encode(encode_request("test/missing", texts), timeout=60)
        assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert stub.GetModel(inference_pb2.GetModelRequest(model="test/missing")).model.failure.attempts == 1
        # ...and the other model keeps serving.
        np.testing.assert_allclose(encode_when_loaded(stub, "test/from-cluster", texts)[0], reference, atol=1e-5)


def test_a_retryable_load_failure_cools_down(start_worker, tmp_path) -> None:
    from worker_process import free_port

    (tmp_path / "m.yaml").write_text("id: test/remote\nhf_id: org/remote\nprofiles:\n  default:\n    adapter: sentence_transformer\n")
    worker = start_worker(
        SIE_MODELS_DIR=str(tmp_path),
        SIE_PRELOAD_MODELS="",
        SIE_LOCAL_CACHE=str(tmp_path / "local"),
        SIE_CLUSTER_CACHE="s3://unreachable/cache",
        SIE_S3_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        SIE_HF_FALLBACK="false",
        SIE_LOAD_RETRY_COOLDOWN_S="120",
    )
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            encode_when_loaded(stub, "test/remote", ["x"])
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(raised.value).reason == "MODEL_LOAD_BACKOFF"
        assert "next attempt in" in raised.value.details() and "cluster cache s3://unreachable/cache" in raised.value.details()
        assert retry_delay_s(raised.value) > 60
        model = stub.GetModel(inference_pb2.GetModelRequest(model="test/remote")).model
        assert model.state == inference_pb2.MODEL_STATE_FAILED
        assert (model.failure.permanent, model.failure.attempts) == (False, 1)
        assert model.failure.retry_in_s > 60


@pytest.mark.parametrize(
    ("fields", "key"),
    [
        ({"hf_id": "BAAI/bge-small-en-v1.5"}, "BAAI--bge-small-en-v1.5@main"),
        ({"hf_id": "org/m", "revision": "refs/pr/1"}, "org--m@refs--pr--1"),
        # The validator refuses such a revision; a config built past it still names one folder, never a path.
        ({"hf_id": "org/m", "revision": "../../etc"}, "org--m@..--..--etc"),
    ],
)
def test_weights_key_is_one_folder_name(fields: dict, key: str) -> None:
    assert weights_key(ModelConfig(id=fields["hf_id"], source="t", **fields)) == key
