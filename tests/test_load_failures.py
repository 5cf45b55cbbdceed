"""Models whose load fails for a permanent reason, through a real worker: each answers FAILED_PRECONDITION
(MODEL_LOAD_FAILED) with the cause, and a second request answers the same without a new load attempt,
while a healthy model in the same worker keeps serving. Out of memory and unreachable sources stay
retryable (tests/test_weight_tiers.py shows an unreachable cluster cache through a worker)."""

from __future__ import annotations

import errno
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_worker.models.load_errors import is_permanent
from sie_worker.weights.resolver import WeightsNotFound
from tiny_models import build_tiny_head_model, build_tiny_model, write_config
from worker_process import Services, inference_stub

RERANKER = "tasks: [score]\nprofiles:\n  default:\n    adapter: cross_encoder\n"
HEALTHY = "test/healthy-reranker"


def _edit_config(directory: Path, **changes: object) -> None:
    config = directory / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **changes}))


def _needs_missing_package(directory: Path) -> None:
    _edit_config(directory, auto_map={"AutoModelForSequenceClassification": "modeling_needs.Model"})
    (directory / "modeling_needs.py").write_text("import sie_package_not_installed\n")


def _refused_module(directory: Path) -> None:
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": len(modules), "name": "3", "path": "3_LSTM", "type": "sentence_transformers.models.LSTM"})
    (directory / "modules.json").write_text(json.dumps(modules))


# model id -> (how the reranker directory is broken, extra profile lines, what the error must name)
BROKEN: dict[str, tuple[Callable[[Path], None], str, str]] = {
    "test/missing-dependency": (_needs_missing_package, "    load_options: {trust_remote_code: true}\n", "sie_package_not_installed"),
    "test/unknown-architecture": (
        lambda d: _edit_config(d, model_type="not-a-model", architectures=["NotAModel"]),
        "",
        "does not recognize this architecture",
    ),
    "test/bad-config-json": (lambda d: (d / "config.json").write_text("{not json"), "", "config.json' is not a valid JSON file"),
    "test/corrupt-weights": (lambda d: (d / "model.safetensors").write_bytes(b"\0" * 64), "", "SafetensorError"),
    "test/no-weight-file": (lambda d: (d / "model.safetensors").unlink(), "", "no file named model.safetensors"),
    "test/mismatched-weights": (lambda d: _edit_config(d, hidden_size=64, intermediate_size=128), "", "ignore_mismatched_sizes"),
}
REFUSED_MODULE = "test/refused-module"


@pytest.fixture(scope="module")
def failing_models_stub(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[inference_pb2_grpc.InferenceStub]:
    root = tmp_path_factory.mktemp("broken-models")
    configs = root / "configs"
    configs.mkdir()
    healthy = build_tiny_head_model(root / "healthy", "reranker")
    write_config(configs, HEALTHY, f"path: {healthy}\n{RERANKER}")
    for model_id, (breaks, profile_lines, _) in BROKEN.items():
        directory = root / model_id.split("/")[1]
        shutil.copytree(healthy, directory)
        breaks(directory)
        write_config(configs, model_id, f"path: {directory}\n{RERANKER}{profile_lines}")
    encoder = build_tiny_model(root / "encoder", pooling="mean", normalize=True, include_prompt=True)
    _refused_module(encoder)
    write_config(configs, REFUSED_MODULE, f"path: {encoder}\nprofiles:\n  default:\n    adapter: sentence_transformer\n")
    with inference_stub(services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ""})) as stub:
        yield stub


def _request(stub: inference_pb2_grpc.InferenceStub, model_id: str) -> Callable[[], object]:
    if model_id == REFUSED_MODULE:
        items = [types_pb2.Item(id="a", text="a document")]
        return lambda: stub.Encode(inference_pb2.EncodeRequest(model=model_id, items=items), timeout=60)
    query = types_pb2.Item(id="q", text="a query")
    items = [types_pb2.Item(id="a", text="a document")]
    return lambda: stub.Score(inference_pb2.ScoreRequest(model=model_id, query=query, items=items), timeout=60)


@pytest.mark.parametrize("model_id", [*BROKEN, REFUSED_MODULE])
def test_a_permanent_load_failure_is_failed_precondition_with_its_cause(failing_models_stub, model_id: str) -> None:
    cause = BROKEN[model_id][2] if model_id in BROKEN else "module 'LSTM' is not supported by the sentence_transformer adapter"
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(_request(failing_models_stub, model_id))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert cause in raised.value.details()
    described = failing_models_stub.GetModel(inference_pb2.GetModelRequest(model=model_id)).model
    assert described.state == inference_pb2.MODEL_STATE_FAILED
    assert (described.failure.permanent, described.failure.attempts) == (True, 1)
    # Not retried: the next request gets the same answer, and no new attempt was made.
    with pytest.raises(grpc.RpcError) as again:
        _request(failing_models_stub, model_id)()
    assert (again.value.code(), error_info(again.value).reason, again.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "MODEL_LOAD_FAILED",
        raised.value.details(),
    )
    assert failing_models_stub.GetModel(inference_pb2.GetModelRequest(model=model_id)).model.failure.attempts == 1
    # The worker serves its healthy model all along.
    response, _ = call_until_loaded(_request(failing_models_stub, HEALTHY))
    assert len(response.scores) == 1


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        MemoryError(),
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes"),
        ConnectionError("connection refused"),
        TimeoutError("read timed out"),
        OSError(errno.ENOSPC, "No space left on device"),
        WeightsNotFound("no weights found for org/m; tried: cluster cache s3://b/c: endpoint unreachable", retryable=True),
    ],
)
def test_out_of_memory_and_unreachable_sources_stay_retryable(error: BaseException) -> None:
    assert not is_permanent(error)


def test_an_import_error_behind_another_error_is_permanent() -> None:
    try:
        try:
            import sie_package_not_installed  # noqa: F401
        except ImportError as missing:
            raise RuntimeError("could not build the model") from missing
    except RuntimeError as error:
        assert is_permanent(error)
