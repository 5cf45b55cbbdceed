"""The shipped catalog (catalog/models/): every file validates and is served by exactly the bundle it
should be; a worker started with it lists every model its bundle serves without any weights; a model
whose weights are nowhere answers MODEL_LOAD_FAILED naming them, and the worker serves the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from conftest import MINILM
from grpc_helpers import call_until_loaded, encode_request, encode_when_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_common.cluster.bundles import load_bundles
from sie_common.cluster.model_config import ModelConfig, load_model_config
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.contract import LoadContext
from tiny_models import build_tiny_gliner, build_tiny_head_model, build_tiny_model
from worker_process import Services

ROOT = Path(__file__).parents[1]
CATALOG = ROOT / "catalog" / "models"
BUNDLES = load_bundles(ROOT / "bundles")
FILES = sorted(CATALOG.glob("*.yaml"))
# A small model of the catalog that no test machine has weights for.
ABSENT = "intfloat/e5-small-v2"


def _configs() -> dict[str, ModelConfig]:
    return {config.id: config for config in map(load_model_config, FILES)}


def _expected_bundle(config: ModelConfig) -> str:
    """The large LLM-based models (bundles/llm.yaml lists them) belong to `llm`; everything else to `default`."""
    return "llm" if config.id in BUNDLES["llm"].models else "default"


@pytest.mark.parametrize("path", FILES, ids=[path.name for path in FILES])
def test_every_catalog_file_validates_and_is_served_by_exactly_its_bundle(path: Path) -> None:
    config = load_model_config(path)
    assert path.name == config.id.replace("/", "__") + ".yaml"
    assert config.hf_id and config.path is None
    serving = [bundle.id for bundle in BUNDLES.values() if bundle.can_serve(config)]
    assert serving == [_expected_bundle(config)]
    if config.profile().adapter == "llm_reranker":
        assert serving == ["llm"]


def test_the_catalog_has_each_family_and_unique_ids() -> None:
    configs = _configs()
    assert len(configs) == len(FILES)
    adapters = {config.profile().adapter for config in configs.values()}
    assert {"sentence_transformer", "cross_encoder", "gliner"} <= adapters


def test_the_default_bundle_excludes_exactly_the_llm_bundles_models() -> None:
    assert BUNDLES["llm"].models and sorted(BUNDLES["default"].exclude_models) == sorted(BUNDLES["llm"].models)


# Load options a tiny BERT replica can stand for (decoder-LLM options need a decoder).
_ENCODER_OPTIONS = {"pooling", "normalize", "trust_remote_code"}


def _replica_kind(config: ModelConfig) -> str | None:
    profile = config.profile()
    if profile.adapter == "sentence_transformer" and set(profile.load_options) <= _ENCODER_OPTIONS:
        return "encoder"
    return {"cross_encoder": "reranker", "gliner": "gliner"}.get(profile.adapter or "")


REPLICATED = [path for path in FILES if _replica_kind(load_model_config(path))]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("catalog-replicas")
    return {
        "encoder": build_tiny_model(root / "encoder", pooling="mean", normalize=False, include_prompt=True),
        "reranker": build_tiny_head_model(root / "reranker", "reranker"),
        "gliner": build_tiny_gliner(root / "gliner", bi_encoder=False),
    }


@pytest.mark.parametrize("path", REPLICATED, ids=[path.name for path in REPLICATED])
def test_its_adapter_takes_every_option_of_a_catalog_profile(path: Path, replicas: dict[str, Path]) -> None:
    """Each profile loads over a tiny replica of its architecture family (dims aside: the replica is 32 wide)."""
    config = dataclasses.replace(load_model_config(path), dims=None)
    for name in config.profiles:
        profile = config.profile(name)
        context = LoadContext(
            config=config,
            profile=profile,
            weights=replicas[_replica_kind(config)],
            device=torch.device("cpu"),
            dtype=torch.float32,
            attention_backend="auto",
            cpu_onednn=False,
            cpu_unpadded=False,
        )
        adapter = ADAPTERS[profile.adapter]
        adapter.spec.check_config(config)
        adapter(context)


@pytest.fixture(scope="module")
def catalog_stubs(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, inference_pb2_grpc.InferenceStub]]:
    """A worker per bundle, started with the catalog (together, so their start-ups overlap), no weights anywhere."""
    root = tmp_path_factory.mktemp("catalog")
    env = {"SIE_MODELS_DIR": str(CATALOG), "SIE_PRELOAD_MODELS": "", "SIE_LOCAL_CACHE": str(root / "cache"), "SIE_HF_FALLBACK": "false"}
    workers = {bundle: services.start({**env, "SIE_BUNDLE": bundle}, name=f"worker-{bundle}") for bundle in ("default", "llm")}
    channels = {}
    try:
        for bundle, worker in workers.items():
            worker.wait_serving()
            channels[bundle] = grpc.insecure_channel(worker.address)
        yield {bundle: inference_pb2_grpc.InferenceStub(channel) for bundle, channel in channels.items()}
    finally:
        for channel in channels.values():
            channel.close()


@pytest.fixture
def default_bundle_stub(catalog_stubs: dict[str, inference_pb2_grpc.InferenceStub]) -> inference_pb2_grpc.InferenceStub:
    return catalog_stubs["default"]


def test_a_worker_started_with_the_catalog_lists_every_model_of_its_bundle(default_bundle_stub) -> None:
    listed = default_bundle_stub.ListModels(inference_pb2.ListModelsRequest())
    assert list(listed.config_problems) == []
    served = {model_id for model_id, config in _configs().items() if _expected_bundle(config) == "default"}
    assert {model.id for model in listed.models} == served | {MINILM}
    by_id = {model.id: model for model in listed.models}
    for model_id, config in _configs().items():
        if model_id in served:
            model = by_id[model_id]
            assert (list(model.tasks), list(model.output_types), model.dims) == (list(config.tasks), list(config.output_types), config.dims or 0)
            assert model.state == inference_pb2.MODEL_STATE_AVAILABLE


def test_the_llm_bundle_lists_only_its_models(catalog_stubs) -> None:
    listed = catalog_stubs["llm"].ListModels(inference_pb2.ListModelsRequest())
    assert list(listed.config_problems) == []
    assert {model.id for model in listed.models} == {model_id for model_id, config in _configs().items() if _expected_bundle(config) == "llm"}


def test_absent_weights_are_a_load_failure_naming_them_and_the_worker_serves_the_rest(default_bundle_stub) -> None:
    revision = _configs()[ABSENT].revision or "main"
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: default_bundle_stub.Encode(encode_request(ABSENT, ["a query"]), timeout=60))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    details = raised.value.details()
    assert f"no weights found for {ABSENT}" in details
    assert f"no {ABSENT.replace('/', '--')}@{revision}" in details  # the local cache, by Hub id and revision
    assert "Hugging Face Hub: disabled (SIE_HF_FALLBACK=false)" in details
    vectors, _ = encode_when_loaded(default_bundle_stub, MINILM, ["the demo model still serves"])
    assert vectors.shape == (1, 384) and np.isfinite(vectors).all()
