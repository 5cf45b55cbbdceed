"""A bad config file never takes down the worker or the other models: each
one is reported with its own precise message (ListModels and the log) and the
rest are served, from a local directory or an s3:// prefix."""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import numpy as np
import pytest

from grpc_helpers import encode_request, encode_when_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc

GOOD_ID = "test/good"


def good_config(weights: Path) -> str:
    return f"id: {GOOD_ID}\npath: {weights}\nprofiles:\n  default:\n    adapter: sentence_transformer\n"


def profile(body: str) -> str:
    return f"id: org/m\nhf_id: org/m\nprofiles:\n  default:\n{body}"


# file name -> (content, the message ListModels reports after "<source>: ")
BAD_CONFIGS: dict[str, tuple[bytes, str]] = {
    "broken-yaml.yaml": (b"id: [unclosed\n", "not valid YAML"),
    "not-a-mapping.yaml": (b"- just\n- a list\n", "a model config must be a mapping"),
    "unknown-field.yaml": (profile("    adapter: sentence_transformer\n").encode() + b"colour: blue\n", "colour: unknown field; expected one of"),
    "bad-id.yaml": (b"id: ../escape\nhf_id: x\nprofiles: {default: {adapter: a}}\n", "id: '../escape' is not a model id"),
    "no-weights.yaml": (b"id: org/m\nprofiles: {default: {adapter: a}}\n", "no weights: set hf_id, path or bundled_weights"),
    "no-profiles.yaml": (b"id: org/m\nhf_id: org/m\n", "profiles: required: a mapping with at least a 'default' profile"),
    "no-adapter.yaml": (profile("    max_batch_tokens: 100\n").encode(), "profiles.default.adapter: required (directly or through extends)"),
    "zero-tokens.yaml": (
        profile("    adapter: a\n    max_batch_tokens: 0\n").encode(),
        "profiles.default.max_batch_tokens: must be a positive integer, got 0",
    ),
    "bad-precision.yaml": (
        profile("    adapter: a\n    compute_precision: int4\n").encode(),
        "profiles.default.compute_precision: 'int4' is not one of float32, float16, bfloat16",
    ),
    "bad-output.yaml": (
        b"id: org/m\nhf_id: org/m\noutput_types: [dense, rainbow]\nprofiles: {default: {adapter: a}}\n",
        "output_types: 'rainbow' is not one of dense, sparse, multivector",
    ),
    "extends-cycle.yaml": (
        b"id: org/m\nhf_id: org/m\nprofiles:\n  default: {extends: b}\n  b: {extends: default}\n",
        "profiles.default: extends cycle: default -> b -> default",
    ),
    "not-utf8.yaml": (b"id: \xff\xfe\n", "cannot read"),
    "zz-duplicate.yaml": (b"", f"id: model '{GOOD_ID}' is already defined in "),  # content filled in below
}


def write_configs(directory: Path, weights: Path) -> dict[str, str]:
    """The good config plus every bad one; returns file name -> expected message."""
    (directory / "good.yaml").write_text(good_config(weights))
    expected = {}
    for name, (content, message) in BAD_CONFIGS.items():
        (directory / name).write_bytes(content or good_config(weights).encode())
        expected[name] = message
    return expected


def assert_good_model_serves_and_problems_reported(stub, expected: dict[str, str], source_of) -> None:
    listed = stub.ListModels(inference_pb2.ListModelsRequest())
    problems = {problem.source: problem.message for problem in listed.config_problems}
    assert sorted(problems) == sorted(source_of(name) for name in expected)
    for name, message in expected.items():
        source = source_of(name)
        assert problems[source].startswith(f"{source}: {message}"), problems[source]
    assert GOOD_ID in {model.id for model in listed.models}
    vectors, _ = encode_when_loaded(stub, GOOD_ID, ["still serving"])
    assert vectors.shape == (1, 32) and np.isfinite(vectors).all()


def test_bad_config_files_are_reported_and_the_rest_serve(start_worker, tiny_models, tmp_path) -> None:
    expected = write_configs(tmp_path, tiny_models["test/tiny-mean"])
    (tmp_path / "other-bundle.yaml").write_text(f"id: test/other\npath: {tiny_models['test/tiny-mean']}\nprofiles: {{default: {{adapter: no_such_adapter}}}}\n")
    worker = start_worker(SIE_MODELS_DIR=str(tmp_path), SIE_PRELOAD_MODELS=GOOD_ID)
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert_good_model_serves_and_problems_reported(stub, expected, lambda name: str(tmp_path / name))
        # A valid config for an adapter this worker's bundle does not run is not served, and says why.
        with pytest.raises(grpc.RpcError) as raised:
            stub.Encode(encode_request("test/other", ["x"]), timeout=60)
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_info(raised.value).reason == "MODEL_NOT_FOUND"
        assert "bundle 'default' (adapters: " in raised.value.details()
        assert "does not serve it (adapter 'no_such_adapter')" in raised.value.details()
    log = worker.log()
    for name, message in expected.items():
        assert f"model config skipped: {tmp_path / name}: {message}" in log


def test_model_configs_from_an_s3_prefix(start_worker, s3_server, tiny_models, tmp_path) -> None:
    bucket = f"configs-{uuid.uuid4().hex[:8]}"
    client = s3_server.client()
    client.create_bucket(Bucket=bucket)
    local = tmp_path / "configs"
    local.mkdir()
    expected = write_configs(local, tiny_models["test/tiny-mean"])
    for path in local.iterdir():
        client.upload_file(str(path), bucket, f"models/{path.name}")
    client.put_object(Bucket=bucket, Key="models/README.txt", Body=b"not a config")
    worker = start_worker(
        SIE_MODELS_DIR=f"s3://{bucket}/models", SIE_S3_ENDPOINT_URL=s3_server.endpoint_url, SIE_PRELOAD_MODELS=GOOD_ID
    )
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert_good_model_serves_and_problems_reported(stub, expected, lambda name: f"s3://{bucket}/models/{name}")
