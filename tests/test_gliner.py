"""GLiNER through a real worker against `gliner`'s own `GLiNER.inference` in-process, on tiny random
uni-encoder and bi-encoder replicas built offline: identical spans (start, end, label), scores within
1e-4, at the default threshold and a higher one. Also: a backbone asking for shipped code is refused
without trust_remote_code, and a worker without the package answers ADAPTER_DEPENDENCY_MISSING."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from gliner import GLiNER

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import build_tiny_gliner, write_config
from worker_process import Services, WorkerProcess, inference_stub

MODELS = {"test/gliner-uni": False, "test/gliner-bi": True}
REMOTE_CODE = "test/gliner-remote-code"
EXTRACT = "tasks: [extract]\nprofiles:\n  default:\n    adapter: gliner\n"
# Profiles with run_options: a default threshold of the model's own, and merged adjacent entities.
PROFILES = (
    "  strict:\n    extends: default\n    run_options: {threshold: 0.75}\n"
    "  merged:\n    extends: default\n    run_options: {merge_adjacent_entities: true}\n"
)
TEXTS = [
    "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine.",
    "Marie Curie was born in Warsaw and moved to Paris.",
    "The Eiffel Tower is in Paris .",
]
LABELS = ["person", "city", "machine"]


@pytest.fixture(scope="module")
def directories(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gliner")
    built = {model_id: build_tiny_gliner(root / model_id.split("/")[1], bi_encoder=bi) for model_id, bi in MODELS.items()}
    remote = root / "remote-code"
    shutil.copytree(built["test/gliner-uni"], remote)
    config = json.loads((remote / "gliner_config.json").read_text())
    config["encoder_config"]["auto_map"] = {"AutoModel": "modeling_backbone.Backbone"}
    (remote / "gliner_config.json").write_text(json.dumps(config))
    built[REMOTE_CODE] = remote
    return built


def _start(directories: dict[str, Path], root: Path, **env: str) -> WorkerProcess:
    configs = root / "configs"
    configs.mkdir()
    for model_id, directory in directories.items():
        write_config(configs, model_id, f"path: {directory}\n{EXTRACT}{PROFILES}")
    worker = WorkerProcess({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": "", **env}, root / "worker.log")
    worker.wait_serving()
    return worker


@pytest.fixture(scope="module")
def gliner_stub(
    services: Services, directories: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(services.keep(_start(directories, tmp_path_factory.mktemp("gliner-worker")))) as stub:
        yield stub


def _extract(stub: inference_pb2_grpc.InferenceStub, model_id: str, threshold: float | None, profile: str = "") -> inference_pb2.ExtractResponse:
    items = [types_pb2.Item(id=str(index), text=text) for index, text in enumerate(TEXTS)]
    request = inference_pb2.ExtractRequest(model=model_id, items=items, labels=LABELS, profile=profile)
    if threshold is not None:
        request.threshold = threshold
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=60))
    return response


@pytest.mark.parametrize("threshold", [None, 0.75])
@pytest.mark.parametrize("model_id", list(MODELS))
def test_spans_equal_gliner_inference(gliner_stub, directories: dict[str, Path], model_id: str, threshold: float | None) -> None:
    reference = GLiNER.from_pretrained(str(directories[model_id]), local_files_only=True).inference(
        TEXTS, LABELS, threshold=0.5 if threshold is None else threshold
    )
    response = _extract(gliner_stub, model_id, threshold)
    assert sum(len(entities) for entities in reference) >= 3
    for text, expected, result in zip(TEXTS, reference, response.results):
        assert [(e.start, e.end, e.label) for e in result.entities] == [(e["start"], e["end"], e["label"]) for e in expected]
        assert [e.text for e in result.entities] == [text[e["start"] : e["end"]] for e in expected]
        for served, wanted in zip(result.entities, expected):
            assert abs(served.score - wanted["score"]) <= 1e-4


def test_a_profile_threshold_is_the_default(gliner_stub, directories: dict[str, Path]) -> None:
    reference = GLiNER.from_pretrained(str(directories["test/gliner-uni"]), local_files_only=True).inference(TEXTS, LABELS, threshold=0.75)
    response = _extract(gliner_stub, "test/gliner-uni", None, profile="strict")
    assert [[(e.start, e.end, e.label) for e in result.entities] for result in response.results] == [
        [(e["start"], e["end"], e["label"]) for e in entities] for entities in reference
    ]


def nuner_zero_card_merge(text: str, entities: list[dict]) -> list[dict]:
    """NuNER Zero's model card's merge_entities, as the card writes it (on copies, so the reference stays)."""
    if not entities:
        return []
    merged = []
    current = dict(entities[0])
    for next_entity in entities[1:]:
        if next_entity["label"] == current["label"] and (
            next_entity["start"] == current["end"] + 1 or next_entity["start"] == current["end"]
        ):
            current["text"] = text[current["start"] : next_entity["end"]].strip()
            current["end"] = next_entity["end"]
        else:
            merged.append(current)
            current = dict(next_entity)
    merged.append(current)
    return merged


def test_adjacent_entities_of_one_label_merge_as_the_nuner_zero_card_merges(gliner_stub, directories: dict[str, Path]) -> None:
    """Runs of one label at most one character apart become one entity, scored as its first part."""
    reference = GLiNER.from_pretrained(str(directories["test/gliner-uni"]), local_files_only=True).inference(TEXTS, LABELS, threshold=0.5)
    response = _extract(gliner_stub, "test/gliner-uni", None, profile="merged")
    merges = 0
    for text, entities, result in zip(TEXTS, reference, response.results):
        expected = nuner_zero_card_merge(text, entities)
        merges += len(entities) - len(expected)
        assert [(e.start, e.end, e.label, e.text) for e in result.entities] == [
            (e["start"], e["end"], e["label"], e["text"]) for e in expected
        ]
        for served, wanted in zip(result.entities, expected):
            assert abs(served.score - wanted["score"]) <= 1e-4
    assert merges >= 2


def test_a_backbone_that_names_shipped_code_is_refused_without_trust_remote_code(gliner_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _extract(gliner_stub, REMOTE_CODE, None)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "encoder_config names code shipped with the weights (auto_map)" in raised.value.details()


@pytest.mark.process
def test_a_worker_without_the_package_answers_dependency_missing(directories: dict[str, Path], tmp_path: Path) -> None:
    # A `gliner` that cannot be imported, first on the worker's path: as if the package were not installed.
    hidden = tmp_path / "no-gliner" / "gliner"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'gliner'\", name='gliner')\n")
    path = os.pathsep.join(filter(None, [str(hidden.parent), os.environ.get("PYTHONPATH", "")]))
    worker = _start({"test/gliner-uni": directories["test/gliner-uni"]}, tmp_path, PYTHONPATH=path)
    try:
        with grpc.insecure_channel(worker.address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                _extract(inference_pb2_grpc.InferenceStub(channel), "test/gliner-uni", None)
    finally:
        worker.stop()
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "ADAPTER_DEPENDENCY_MISSING"
    assert "missing module 'gliner'" in raised.value.details() and "pip install gliner --no-deps" in raised.value.details()
