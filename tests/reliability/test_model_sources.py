"""What a model config may make a worker read and run: weights only from inside SIE_WEIGHT_ROOTS ('..',
absolute paths elsewhere and symlinks that escape are reported as config problems and never read), and
code shipped with weights only when the config sets load_options.trust_remote_code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from grpc_helpers import call_until_loaded, encode_request, error_reason, stacked
from sie.v1 import inference_pb2, inference_pb2_grpc
from tiny_models import write_config

ST = "profiles:\n  default:\n    adapter: sentence_transformer\n"


def remote_code_model(source: Path, directory: Path, marker: Path) -> Path:
    """A copy of `source` whose config names a model class in a Python file shipped with it; importing
    that file writes `marker`, so the test sees whether the code ran."""
    shutil.copytree(source, directory)
    config = json.loads((directory / "config.json").read_text())
    config.update(
        model_type="sie-remote-bert",
        auto_map={"AutoConfig": "configuration_remote.RemoteConfig", "AutoModel": "modeling_remote.RemoteModel"},
    )
    (directory / "config.json").write_text(json.dumps(config))
    (directory / "configuration_remote.py").write_text(
        "from transformers import BertConfig\n\n\nclass RemoteConfig(BertConfig):\n    model_type = 'sie-remote-bert'\n"
    )
    (directory / "modeling_remote.py").write_text(
        "import pathlib\n\nfrom transformers import BertModel\n\nfrom .configuration_remote import RemoteConfig\n\n"
        f"pathlib.Path({str(marker)!r}).write_text('the shipped code ran')\n\n\n"
        "class RemoteModel(BertModel):\n    config_class = RemoteConfig\n"
    )
    return directory


@pytest.fixture(scope="module")
def sources(tmp_path_factory, tiny_models, start_module_worker):
    """A worker whose only weight root is `allowed/`, with a config for each way in and out of it."""
    tmp = tmp_path_factory.mktemp("model-sources")
    allowed, outside, configs = tmp / "allowed", tmp / "outside", tmp / "allowed" / "configs"
    configs.mkdir(parents=True)
    tiny = tiny_models["test/tiny-mean"]
    shutil.copytree(tiny, allowed / "weights")
    shutil.copytree(tiny, outside / "weights")
    # Inside the root, but its weights file is a link to a file outside it.
    shutil.copytree(tiny, allowed / "escape")
    (allowed / "escape" / "model.safetensors").unlink()
    (allowed / "escape" / "model.safetensors").symlink_to(outside / "weights" / "model.safetensors")
    marker = tmp / "remote-code-ran"
    remote_code_model(tiny, allowed / "remote", marker)

    write_config(configs, "test/inside", f"path: {allowed / 'weights'}\n{ST}")
    write_config(configs, "test/relative-inside", f"path: ../weights\n{ST}")
    write_config(configs, "test/absolute-outside", f"path: {outside / 'weights'}\n{ST}")
    write_config(configs, "test/symlink-escape", f"path: {allowed / 'escape'}\n{ST}")
    write_config(configs, "test/lora-outside", f"path: {allowed / 'weights'}\nloras:\n  x: {outside / 'weights'}\n{ST}")
    write_config(configs, "test/lora-traversal", f"path: {allowed / 'weights'}\nloras:\n  x: ../../etc\n{ST}")
    write_config(configs, "test/remote-untrusted", f"path: {allowed / 'remote'}\n{ST}")
    write_config(configs, "test/remote-trusted", f"path: {allowed / 'remote'}\n{ST}    load_options: {{trust_remote_code: true}}\n")
    worker = start_module_worker(SIE_MODELS_DIR=str(configs), SIE_WEIGHT_ROOTS=str(allowed), SIE_PRELOAD_MODELS="test/inside")
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel), configs, marker


EXPECTED_PROBLEMS = {
    "test--relative-inside.yaml": "path: '../weights' contains '..'",
    "test--absolute-outside.yaml": "is outside the allowed weight roots",
    "test--symlink-escape.yaml": "model.safetensors links to ",
    "test--lora-outside.yaml": "loras.x ",
    "test--lora-traversal.yaml": "loras.x: '../../etc' contains '..'",
}


def test_configs_pointing_outside_the_weight_roots_are_reported_not_served(sources, reliability_report) -> None:
    stub, configs, _ = sources
    listed = stub.ListModels(inference_pb2.ListModelsRequest())
    problems = {Path(problem.source).name: problem.message for problem in listed.config_problems}
    served = {model.id for model in listed.models}
    for name, message in EXPECTED_PROBLEMS.items():
        model = "test/" + name.removeprefix("test--").removesuffix(".yaml")
        reliability_report.add("security", f"weight roots: {name}", expected="reported, not served", actual="reported" if name in problems else "accepted")
        assert message in problems.get(name, ""), (name, problems.get(name))
        assert model not in served
    assert "outside the allowed weight roots" in problems["test--lora-outside.yaml"]
    assert {"test/inside", "test/remote-untrusted", "test/remote-trusted"} <= served
    vectors, _ = call_until_loaded(lambda: stub.Encode(encode_request("test/inside", ["inside the root"]), timeout=60))
    assert stacked(r.dense for r in vectors.results).shape == (1, 32)


def test_code_shipped_with_weights_runs_only_when_the_config_trusts_it(sources, reliability_report) -> None:
    stub, _, marker = sources
    with pytest.raises(grpc.RpcError) as refused:
        call_until_loaded(lambda: stub.Encode(encode_request("test/remote-untrusted", ["x"]), timeout=60))
    reliability_report.add("security", "trust_remote_code unset: shipped code", expected="not run", actual="ran" if marker.exists() else "not run")
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_reason(refused.value) == "MODEL_LOAD_FAILED"
    assert "trust_remote_code" in refused.value.details()
    assert not marker.exists()

    trusted, _ = call_until_loaded(lambda: stub.Encode(encode_request("test/remote-trusted", ["x"]), timeout=60))
    reliability_report.add("security", "trust_remote_code: true: shipped code", expected="ran", actual="ran" if marker.exists() else "not run")
    assert marker.exists()
    assert np.isfinite(stacked(r.dense for r in trusted.results)).all()
