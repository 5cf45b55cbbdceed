"""jinaai/jina-reranker-v2-base-multilingual served natively on transformers' XLMRobertaForSequenceClassification:
its shipped catalog config, its weights a tiny random replica in the checkpoint's own layout (tools/tiny_jina.py:
jinaai's XLM-RoBERTa flash code, a config.json with no model type and `auto_map`, fused `mixer.Wqkv`, `emb_ln`,
`norm1` / `norm2`), served by one worker.

The reference is transformers' own class in-process over the same weights saved natively, scored as the checkpoint's
`compute_score` does (the pair tokenized together, sigmoid of the one logit): within 1e-4. Its positions are
XLM-RoBERTa's, counted from the padding index + 1, as the flash code's embedding counts them; positions from 0 move
the scores past that bound (`test_the_position_check_would_catch_positions_from_zero`).

The shipped code `auto_map` names is a tripwire in the served copy (it records that it ran, then fails): an answer at
all shows no shipped code ran; a profile that trusts it runs it. The rotary variant (jina-colbert-v2's) and LoRA
adapters are refused at load, never served differently.
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

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_jina import JinaReplica, build_jina_reranker
from tiny_shipped_code import TRIPWIRE, tripwire_copy
from worker_process import Services, inference_stub

CATALOG = Path(__file__).resolve().parents[1] / "catalog" / "models"
RERANKER = "jinaai/jina-reranker-v2-base-multilingual"
TRUSTED = "test/jina-reranker-trusted"
REFUSED = {
    "test/jina-rotary": ({"position_embedding_type": "rotary", "rotary_emb_base": 20000.0}, "absolute positions only"),
    "test/jina-lora": ({"lora_adaptations": ["retrieval.query"]}, "LoRA adaptations"),
}
SHIPPED_CODE = ("configuration_xlm_roberta.py", "modeling_xlm_roberta.py")
QUERY = "which fox jumps over the lazy dog?"
DOCUMENTS = [
    "the quick brown fox jumps over the lazy dog",
    "search engines rank documents by relevance",
    "a",
    "embeddings map text to vectors and similar meanings land close together in the space of vectors",
    "I love 🍕 pizza and ünïcödé 文字!",
    " ".join(["sparse dense multivector retrieval query passage model"] * 20),  # past the 64 tokens: cut
]


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> JinaReplica:
    return build_jina_reranker(tmp_path_factory.mktemp("jina-replica"))


@pytest.fixture(scope="module")
def served(replica: JinaReplica, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jina-served")
    directories = {RERANKER: tripwire_copy(replica.shipped, root / "reranker", SHIPPED_CODE)}
    for index, (model_id, (change, _)) in enumerate(REFUSED.items()):
        copy = shutil.copytree(directories[RERANKER], root / f"refused-{index}")
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **change}))
        directories[model_id] = copy
    directories[TRUSTED] = tripwire_copy(replica.shipped, root / "trusted", SHIPPED_CODE)
    return directories


def _served_config(model_id: str, directory: Path, **load_options: Any) -> dict[str, Any]:
    """The catalog file of the reranker as shipped, its weights read from `directory`."""
    config = yaml.safe_load((CATALOG / f"{RERANKER.replace('/', '__')}.yaml").read_text())
    assert "trust_remote_code" not in json.dumps(config)
    del config["hf_id"]
    config.pop("revision", None)
    if load_options:
        config["profiles"]["default"]["load_options"] = load_options
    return {**config, "id": model_id, "path": str(directory)}


@pytest.fixture(scope="module")
def stub(
    services: Services, served: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("jina-configs")
    for index, model_id in enumerate([RERANKER, *REFUSED]):
        config = _served_config(model_id, served[model_id])
        (configs / f"model-{index}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    trusted = _served_config(TRUSTED, served[TRUSTED], trust_remote_code=True)
    (configs / "trusted.yaml").write_text(yaml.safe_dump(trusted, sort_keys=False))
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": RERANKER}, name="jina")
    with inference_stub(worker) as inference:
        assert list(inference.ListModels(inference_pb2.ListModelsRequest()).config_problems) == []
        yield inference


def _score(stub, model_id: str, documents: list[str] = DOCUMENTS) -> np.ndarray:
    request = inference_pb2.ScoreRequest(
        model=model_id, query=types_pb2.Item(text=QUERY), items=[types_pb2.Item(text=text) for text in documents]
    )
    response, _ = call_until_loaded(lambda: stub.Score(request, timeout=120))
    scores = {entry.index: entry.score for entry in response.scores}
    return np.array([scores[index] for index in range(len(documents))])


def _reference_scores(replica: JinaReplica, *, positions_from_zero: bool = False) -> np.ndarray:
    """compute_score's: each (query, document) pair tokenized together, sigmoid of the one logit, on transformers'
    XLMRobertaForSequenceClassification over the native copy (positions from 0 instead, where asked)."""
    from transformers import AutoTokenizer, XLMRobertaForSequenceClassification

    model = XLMRobertaForSequenceClassification.from_pretrained(replica.native).eval()
    tokenizer = AutoTokenizer.from_pretrained(replica.native)
    scores = []
    with torch.no_grad():
        for document in DOCUMENTS:
            inputs = tokenizer(QUERY, document, truncation=True, return_tensors="pt")
            extra = {"position_ids": torch.arange(inputs["input_ids"].shape[1])[None]} if positions_from_zero else {}
            scores.append(torch.sigmoid(model(**inputs, **extra).logits[0, 0]).item())
    return np.array(scores)


def test_jina_reranker_v2_equals_transformers_xlm_roberta(stub, replica: JinaReplica, served: dict[str, Path]) -> None:
    expected = _reference_scores(replica)
    np.testing.assert_allclose(_score(stub, RERANKER), expected, atol=1e-4)
    assert np.ptp(expected) > 0.01  # the documents score apart: a wrong weight would show
    assert not (served[RERANKER] / TRIPWIRE).exists()


def test_the_position_check_would_catch_positions_from_zero(stub, replica: JinaReplica) -> None:
    wrong = _reference_scores(replica, positions_from_zero=True)
    assert np.abs(_score(stub, RERANKER) - wrong).max() > 1e-3


@pytest.mark.parametrize("model_id", list(REFUSED))
def test_variants_without_a_native_form_fail_the_load(stub, model_id: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _score(stub, model_id, ["x"])
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert REFUSED[model_id][1] in raised.value.details()


def test_a_profile_that_trusts_the_shipped_code_runs_it(stub, served: dict[str, Path]) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        _score(stub, TRUSTED, ["x"])
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert (served[TRUSTED] / TRIPWIRE).read_text() == "ran"
