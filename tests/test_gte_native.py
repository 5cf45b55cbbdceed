"""The checkpoints of Alibaba-NLP/new-impl's GTE code served natively on transformers' GteModel / GteForMaskedLM:
gte-multilingual-base, snowflake-arctic-embed-m-v2.0, stella_en_400M_v5 (`sentence_transformer`) and
opensearch-neural-sparse-encoding-doc-v3-gte (`splade`), each through its shipped catalog config, its weights a tiny
random replica in the checkpoint's own layout (tools/tiny_gte.py: new-impl's config keys and weight names, the
`new.` prefix under a head, Snowflake's `gte` model type over new-impl's code), served by one worker.

The reference is transformers' own class in-process, through sentence-transformers (`SentenceTransformer`,
`SparseEncoder`) over the same weights saved natively, its rotary frequencies set to new-impl's fixed-NTK scaling
as that code computes them (written out here, `new_impl_frequencies`): base θ·f, then every frequency divided by
f^(2/d). The worker reaches them only through its translation of the shipped config, so a wrong rotary
translation fails the parity tests (and `test_the_rotary_check_would_catch_a_plain_base_change` shows that it
would on these replicas).

The shipped code named by `auto_map` is a tripwire in each served copy (it records that it ran, then fails): an
answer at all shows no shipped code ran; a profile that trusts it runs it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
import yaml

from grpc_helpers import call_until_loaded, error_info, items
from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_contract.tensors import from_tensor
from tiny_gte import GTE_HEADS, GTE_HIDDEN, LAYOUTS, GteReplica, build_gte
from tiny_shipped_code import TRIPWIRE, tripwire_copy
from worker_process import Services, inference_stub

CATALOG = Path(__file__).resolve().parents[1] / "catalog" / "models"
MULTILINGUAL = "Alibaba-NLP/gte-multilingual-base"
ARCTIC = "Snowflake/snowflake-arctic-embed-m-v2.0"
STELLA = "NovaSearch/stella_en_400M_v5"
OPENSEARCH = "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-gte"
DENSE = [MULTILINGUAL, ARCTIC, STELLA]
# Copies of the multilingual replica whose config asks for what the native class does not compute.
REFUSED = {
    "test/gte-mixed-ntk": ({"rope_scaling": {"type": "ntk", "factor": 8.0, "mixed_b": 0.5}}, "mixed_b"),
    "test/gte-logn": ({"logn_attention_scale": True}, "logn_attention_scale: the native GTE has no log-n"),
    "test/gte-unpacked": ({"pack_qkv": False}, "pack_qkv False: the native GTE serves pack_qkv True only"),
    # Not a number: the rotary frequencies would all be NaN, every vector too.
    "test/gte-nan-factor": ({"rope_scaling": {"type": "ntk", "factor": float("nan")}}, "fixed NTK scaling only"),
    "test/gte-zero-base": ({"rope_theta": 0}, "rope_theta 0.0: a rotary base must be a positive number"),
}
STELLA_TRUSTED = "test/stella-trusted"
SHIPPED_CODE = ("modeling.py", "configuration.py")
WORDS = ["search", "engines", "rank", "documents", "by", "relevance", "and", "embeddings", "map", "text", "to"]
TEXTS = [
    "what is rotary position embedding?",
    "a",
    " ".join(WORDS * 6),  # far past the short texts: rotary positions that differ between scalings show here
    "GTE reads 8,192 tokens; this replica reads fewer.",
    "I love 🍕 pizza and ünïcödé 文字!",
]
INSTRUCTION = "Given a claim, find documents that refute it"


def new_impl_frequencies(config: dict[str, Any]) -> torch.Tensor:
    """new-impl's rotary inverse frequencies for a config.json: theta^(-2i/d) over i < d/2, d the head width; with
    `rope_scaling: {type: ntk, factor: f}` (its NTKScalingRotaryEmbedding, the fixed variant, which rescales once the
    cached length, max_position_embeddings * f, exceeds max_position_embeddings) the base is theta * f and every
    frequency is then divided by f^(2/d)."""
    width = config["hidden_size"] // config["num_attention_heads"]
    theta, scaling = config["rope_theta"], config["rope_scaling"]
    factor = scaling["factor"] if scaling else 1.0
    frequencies = 1.0 / ((theta * factor) ** (torch.arange(0, width, 2).float() / width))
    return frequencies / factor ** (2 / width) if factor > 1 else frequencies


def _transformer_folder(replica: GteReplica) -> Path:
    """The folder of the shipped masked-LM / encoder (the root, or a sparse Router's document transformer)."""
    return next(iter(replica.shipped.glob("document_*/config.json")), replica.shipped / "config.json").parent


def _shipped_config(replica: GteReplica) -> dict[str, Any]:
    return json.loads((_transformer_folder(replica) / "config.json").read_text())


def _gte_module(reference: Any) -> Any:
    """The GteModel inside a sentence-transformers model over the native copy."""
    for module in reference.modules():
        if type(module).__name__ == "GteModel":
            return module
    raise AssertionError("no GteModel in the reference")


def _reference(replica: GteReplica, frequencies: torch.Tensor | None = None) -> Any:
    """sentence-transformers over the native copy, on transformers' own GTE class, its rotary frequencies new-impl's
    for the shipped config (or `frequencies`)."""
    from sentence_transformers import SentenceTransformer, SparseEncoder

    loader = SparseEncoder if replica.layout.architecture == "NewForMaskedLM" else SentenceTransformer
    reference = loader(str(replica.native), device="cpu")
    rotary = _gte_module(reference).rotary_emb
    with torch.no_grad():
        rotary.inv_freq.copy_(new_impl_frequencies(_shipped_config(replica)) if frequencies is None else frequencies)
    return reference


def _served_config(model_id: str, replica: Path) -> dict[str, Any]:
    """The catalog file of `model_id` as shipped, its weights read from `replica` (dims left out: the replica is
    narrower), with a profile `trusted` that runs the shipped code."""
    config = yaml.safe_load((CATALOG / f"{model_id.replace('/', '__')}.yaml").read_text())
    assert config["id"] == model_id
    assert "trust_remote_code" not in json.dumps(config)
    del config["hf_id"]
    config.pop("revision", None)
    config.pop("dims", None)
    return {**config, "path": str(replica)}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GteReplica]:
    root = tmp_path_factory.mktemp("gte-replicas")
    return {model_id: build_gte(root / f"replica-{i}", model_id, seed=i) for i, model_id in enumerate(LAYOUTS)}


@pytest.fixture(scope="module")
def served(replicas: dict[str, GteReplica], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The directories the worker serves, by model id: tripwire copies of the replicas, and the refused layouts."""
    root = tmp_path_factory.mktemp("gte-served")
    directories = {
        model_id: tripwire_copy(replica.shipped, root / f"served-{index}", SHIPPED_CODE)
        for index, (model_id, replica) in enumerate(replicas.items())
    }
    for index, (model_id, (change, _)) in enumerate(REFUSED.items()):
        copy = shutil.copytree(directories[MULTILINGUAL], root / f"refused-{index}")
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **change}))
        directories[model_id] = copy
    directories[STELLA_TRUSTED] = tripwire_copy(replicas[STELLA].shipped, root / "stella-trusted", SHIPPED_CODE)
    return directories


@pytest.fixture(scope="module")
def stub(
    services: Services, served: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("gte-configs")
    for model_id in LAYOUTS:
        config = _served_config(model_id, served[model_id])
        (configs / f"{model_id.replace('/', '--')}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for model_id in REFUSED:
        config = {**_served_config(MULTILINGUAL, served[model_id]), "id": model_id}
        (configs / f"{model_id.replace('/', '--')}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    trusted = _served_config(STELLA, served[STELLA_TRUSTED])
    trusted["profiles"]["default"]["load_options"]["trust_remote_code"] = True
    (configs / "stella-trusted.yaml").write_text(yaml.safe_dump({**trusted, "id": STELLA_TRUSTED}, sort_keys=False))
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ",".join(LAYOUTS)}, name="gte")
    with inference_stub(worker) as inference:
        listed = inference.ListModels(inference_pb2.ListModelsRequest())
        assert list(listed.config_problems) == []
        yield inference


def _encode(stub, model_id: str, texts: list[str] = TEXTS, **fields: Any) -> list[Any]:
    request = inference_pb2.EncodeRequest(model=model_id, items=items(texts), **fields)
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=120))
    return list(response.results)


def _dense(stub, model_id: str, **fields: Any) -> np.ndarray:
    return np.stack([from_tensor(result.dense) for result in _encode(stub, model_id, **fields)])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _expected_dense(model_id: str, reference: Any, fields: dict[str, Any]) -> np.ndarray:
    """The reference's vectors for TEXTS with the catalog config's prompt for `fields` before each, normalized where
    the config says so."""
    config = yaml.safe_load((CATALOG / f"{model_id.replace('/', '__')}.yaml").read_text())["profiles"]["default"]
    run_options = config.get("run_options", {})
    if "instruction" in fields:
        prompt = run_options.get("instruction_prompt", "{instruction}").replace("{instruction}", fields["instruction"])
    else:
        prompt = run_options.get("query_prompt", "") if fields.get("is_query") else ""
    vectors = reference.encode([prompt + text for text in TEXTS], convert_to_numpy=True)
    if config.get("load_options", {}).get("normalize"):
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors


CASES = [{}, {"is_query": True}, {"is_query": True, "instruction": INSTRUCTION}]


@pytest.mark.parametrize("fields", CASES, ids=["document", "query", "instruction"])
@pytest.mark.parametrize("model_id", DENSE)
def test_dense_gte_checkpoints_equal_transformers_gte_model(
    stub, replicas: dict[str, GteReplica], served: dict[str, Path], model_id: str, fields: dict[str, Any]
) -> None:
    """Every text (one past 60 tokens) within cosine 0.9999 of the reference, as wide as it, and no shipped code
    run."""
    expected = _expected_dense(model_id, _reference(replicas[model_id]), fields)
    vectors = _dense(stub, model_id, **fields)
    assert vectors.shape == expected.shape
    assert _cosines(vectors, expected).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-4)
    assert not (served[model_id] / TRIPWIRE).exists()


def test_opensearch_doc_v3_gte_equals_sparse_encoder(stub, replicas: dict[str, GteReplica]) -> None:
    """Documents through GteForMaskedLM (log1p_relu, max pooling), queries by idf alone: the same indices, weights
    within 1e-4."""
    reference = _reference(replicas[OPENSEARCH])
    for is_query in (False, True):
        expected = (reference.encode_query if is_query else reference.encode_document)(TEXTS).to_dense().numpy()
        results = _encode(stub, OPENSEARCH, is_query=is_query)
        for result, row in zip(results, expected, strict=True):
            assert list(result.sparse.indices) == list(np.flatnonzero(row)), (is_query, result.id)
            np.testing.assert_allclose(list(result.sparse.values), row[list(result.sparse.indices)], atol=1e-4)
        assert min(len(result.sparse.indices) for result in results) > 0


def test_the_rotary_check_would_catch_a_plain_base_change(stub, replicas: dict[str, GteReplica]) -> None:
    """On these replicas the rotary frequencies show: reading gte-multilingual-base's fixed NTK (factor 8) as a plain
    base of θ·8 (GteConfig's default base for that checkpoint), without the division by 8^(2/d), moves the long
    text's vector well past the parity bound; so do new-impl's frequencies on the unscaled base θ."""
    replica = replicas[MULTILINGUAL]
    config = _shipped_config(replica)
    width = GTE_HIDDEN // GTE_HEADS
    assert config["rope_scaling"] == {"type": "ntk", "factor": 8.0}
    plain_base = 1.0 / ((config["rope_theta"] * 8) ** (torch.arange(0, width, 2).float() / width))
    unscaled = 1.0 / (config["rope_theta"] ** (torch.arange(0, width, 2).float() / width))
    served_vectors = _dense(stub, MULTILINGUAL)
    for frequencies in (plain_base, unscaled):
        wrong = _expected_dense(MULTILINGUAL, _reference(replica, frequencies), {})
        assert _cosines(served_vectors, wrong).min() < 0.999


@pytest.mark.parametrize("model_id", list(REFUSED))
def test_settings_the_native_class_does_not_compute_fail_the_load(stub, model_id: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _encode(stub, model_id, ["x"])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert REFUSED[model_id][1] in raised.value.details()


def test_a_profile_that_trusts_the_shipped_code_runs_it(stub, served: dict[str, Path]) -> None:
    """stella's code ships in its repository: trusted, it runs (here, the tripwire: the load fails having run it)."""
    with pytest.raises(grpc.RpcError) as raised:
        _encode(stub, STELLA_TRUSTED, ["x"])
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert (served[STELLA_TRUSTED] / TRIPWIRE).read_text() == "ran"


def test_only_a_config_in_new_impl_form_is_translated() -> None:
    """new-impl's own type, or transformers' `gte` beside an `auto_map` in new-impl's keys, is translated; a `gte`
    config in transformers' own form (`rope_parameters`) or with no code named is left to transformers."""
    from sie_worker.adapters.layers.native_architectures import GTE, native_architecture

    shipped = {"model_type": "gte", "auto_map": {"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"}}
    assert native_architecture({"model_type": "new"}) is GTE
    assert native_architecture(shipped) is GTE
    assert native_architecture({**shipped, "rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}) is None
    assert native_architecture({"model_type": "gte"}) is None
