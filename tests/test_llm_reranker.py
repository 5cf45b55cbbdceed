"""LLM rerankers (adapter llm_reranker) score as sentence-transformers' CrossEncoder does on the same weights.

One worker serves tiny random replicas: a Qwen3-Reranker saved by sentence-transformers as a causal-LM
CrossEncoder (LogitScore on yes / no, its prompt in chat_template.jinja), padded right and left; the same
converted to a one-label Qwen3ForSequenceClassification (the `-seq-cls` layout: the model's own head); one whose
tokenizer has no chat template (plain text pairs, the instruction before the query); and an
mxbai-rerank-v2 one (a Qwen2 causal LM with no sentence-transformers files, its prompt, score tokens and
activation in the model config), against the same weights saved as a CrossEncoder whose chat template renders
that prompt; that CrossEncoder directory is served too, with no options (its LogitScore tokens "1" / "0" and its
Identity activation read from the files sentence-transformers saved). The shipped Qwen3-Reranker config's
template, on the Qwen3 replica's bare weights, must equal the CrossEncoder's chat-template prompt; the shipped
mxbai-rerank-v2 configs' options, on the mxbai replica's bare weights, the mxbai-rerank library's raw scores.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
import yaml
from sentence_transformers import CrossEncoder

from grpc_helpers import call_until_loaded, error_details, items
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import write_config
from tiny_rerankers import MXBAI_INSTRUCTION_PROMPT, MXBAI_TEMPLATE, build_tiny_mxbai_reranker, build_tiny_qwen3_reranker
from worker_process import Services, inference_stub

QUERY = "how do plants make energy?"
DOCUMENTS = [
    "photosynthesis turns light into chemical energy",
    "the stock market closed higher today",
    "",
    "Ünïcödé 🚀 文字 and braces {query} {document} {instruction}",
    "Plants need water and sunlight to grow. " * 60,  # over the maximum length: cut, the template tail kept
    "What is the capital of France? Paris.",
]
INSTRUCTION = "Find the passage that answers the question"
QWEN3 = "test/tiny-qwen3-reranker"
QWEN3_LEFT = "test/tiny-qwen3-reranker-left"
MXBAI = "test/tiny-mxbai-reranker"
QWEN3_CLASSIFIER = "test/tiny-qwen3-reranker-seq-cls"
QWEN3_PLAIN = "test/tiny-qwen3-reranker-plain-pairs"
MXBAI_SAVED = "test/tiny-mxbai-reranker-cross-encoder"
# The Qwen3 replica's bare weights with the options of the shipped Qwen3-Reranker config: its template is the prompt.
QWEN3_CATALOG = "test/tiny-qwen3-reranker-catalog-options"
CATALOG_QWEN3 = Path(__file__).resolve().parents[1] / "catalog" / "models" / "Qwen__Qwen3-Reranker-0.6B.yaml"
# The mxbai replica's bare weights with the options of the shipped mxbai-rerank-v2 configs (base and large alike),
# against the mxbai-rerank library itself.
MXBAI_CATALOG = "test/tiny-mxbai-reranker-catalog-options"
CATALOG_MXBAI = [
    Path(__file__).resolve().parents[1] / "catalog" / "models" / f"mixedbread-ai__mxbai-rerank-{size}-v2.yaml"
    for size in ("base", "large")
]
# Served but never preloaded: its score token is not one token of the vocabulary ...
BAD_TOKEN = "test/tiny-llm-reranker-bad-token"
# ... its chat template is made for chat (user / assistant): it would drop a pair's query and document.
CHAT_ONLY = "test/tiny-llm-reranker-chat-only-template"
# ... its template in pieces holds one that is not a text.
BAD_PIECES = "test/tiny-llm-reranker-bad-template-pieces"


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model id -> the CrossEncoder directory sentence-transformers loads as the reference."""
    root = tmp_path_factory.mktemp("llm-rerankers")
    qwen3 = build_tiny_qwen3_reranker(root / "qwen3")
    classifier = build_tiny_qwen3_reranker(root / "qwen3-seq-cls", classifier=True)
    plain_pairs = build_tiny_qwen3_reranker(root / "qwen3-plain", chat_template=False, max_length=64)
    plain, reference = build_tiny_mxbai_reranker(root / "mxbai", max_length=256, identity=True)
    configs = root / "configs"
    configs.mkdir()
    write_config(configs, QWEN3, f"path: {qwen3}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n")
    write_config(
        configs,
        QWEN3_LEFT,
        f"path: {qwen3}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n    load_options: {{padding_side: left}}\n",
    )
    write_config(configs, QWEN3_PLAIN, f"path: {plain_pairs}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n")
    shipped = yaml.safe_load(CATALOG_QWEN3.read_text())["profiles"]["default"]
    write_config(
        configs,
        QWEN3_CATALOG,
        f"path: {qwen3.parent / 'raw'}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n"
        f"    load_options: {json.dumps(shipped['load_options'])}\n    run_options: {json.dumps(shipped['run_options'])}\n",
    )
    mxbai_shipped = [yaml.safe_load(path.read_text())["profiles"]["default"] for path in CATALOG_MXBAI]
    assert mxbai_shipped[0]["load_options"] == mxbai_shipped[1]["load_options"]
    assert mxbai_shipped[0]["run_options"] == mxbai_shipped[1]["run_options"]
    write_config(
        configs,
        MXBAI_CATALOG,
        f"path: {plain}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n"
        f"    load_options: {json.dumps(mxbai_shipped[0]['load_options'])}\n"
        f"    run_options: {json.dumps(mxbai_shipped[0]['run_options'])}\n",
    )
    write_config(configs, MXBAI_SAVED, f"path: {reference}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n")
    write_config(configs, QWEN3_CLASSIFIER, f"path: {classifier}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n")
    options = {"template": MXBAI_TEMPLATE, "true_token": "1", "false_token": "0", "activation": "identity", "padding_side": "left"}
    write_config(
        configs,
        MXBAI,
        f"path: {plain}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n    load_options: {json.dumps(options)}\n"
        f"    run_options: {json.dumps({'instruction_prompt': MXBAI_INSTRUCTION_PROMPT})}\n",
    )
    write_config(
        configs,
        BAD_TOKEN,
        f"path: {qwen3}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n    load_options: {{true_token: certainly}}\n",
    )
    write_config(
        configs,
        BAD_PIECES,
        f"path: {qwen3}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n"
        f"    load_options: {json.dumps({'template': ['{query}', 7, '{document}']})}\n",
    )
    chat_only = root / "chat-only"
    shutil.copytree(plain_pairs, chat_only)
    (chat_only / "chat_template.jinja").write_text(
        "{%- for message in messages -%}{%- if message.role in ['user', 'assistant'] -%}"
        "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif -%}{%- endfor -%}"
    )
    write_config(configs, CHAT_ONLY, f"path: {chat_only}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n")
    return {
        QWEN3: qwen3,
        QWEN3_LEFT: qwen3,
        QWEN3_CATALOG: qwen3,
        QWEN3_CLASSIFIER: classifier,
        QWEN3_PLAIN: plain_pairs,
        MXBAI: reference,
        MXBAI_SAVED: reference,
        MXBAI_CATALOG: plain,
        "configs": configs,
    }


@pytest.fixture(scope="module")
def reranker_stub(services: Services, replicas: dict[str, Path]) -> Iterator[inference_pb2_grpc.InferenceStub]:
    env = {
        "SIE_MODELS_DIR": str(replicas["configs"]),
        "SIE_PRELOAD_MODELS": ",".join(
            [QWEN3, QWEN3_LEFT, QWEN3_CATALOG, QWEN3_CLASSIFIER, QWEN3_PLAIN, MXBAI, MXBAI_SAVED, MXBAI_CATALOG]
        ),
    }
    with inference_stub(services.worker(env, name="llm-reranker-worker")) as stub:
        yield stub


def served_scores(stub, model: str, documents: list[str] = DOCUMENTS, **fields) -> tuple[np.ndarray, list[int]]:
    """The scores in item order, and the ranking (item indices, best first)."""
    request = inference_pb2.ScoreRequest(model=model, query=types_pb2.Item(text=QUERY), items=items(documents), **fields)
    response = stub.Score(request, timeout=120)
    scores = np.zeros(len(documents), dtype=np.float32)
    for entry in response.scores:
        scores[entry.index] = entry.score
    return scores, [entry.index for entry in response.scores]


@pytest.mark.parametrize("instruction", [None, INSTRUCTION])
@pytest.mark.parametrize("model", [QWEN3, QWEN3_LEFT, QWEN3_CATALOG, QWEN3_CLASSIFIER, QWEN3_PLAIN, MXBAI, MXBAI_SAVED])
def test_scores_equal_cross_encoder_logit_score(reranker_stub, replicas: dict[str, Path], model: str, instruction: str | None) -> None:
    reference = CrossEncoder(str(replicas[model]), device="cpu")
    expected = reference.predict([(QUERY, document) for document in DOCUMENTS], prompt=instruction)
    assert np.diff(np.sort(expected)).min() > 1e-4  # no near ties: the ranking below means something
    fields = {} if instruction is None else {"instruction": instruction}
    scores, ranking = served_scores(reranker_stub, model, **fields)
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)
    assert ranking == list(np.argsort(-expected, kind="stable"))


@pytest.mark.parametrize("instruction", [None, INSTRUCTION])
def test_shipped_mxbai_configs_score_as_the_mxbai_rerank_library(
    reranker_stub, replicas: dict[str, Path], instruction: str | None
) -> None:
    """The raw logit difference of "1" and "0", unbounded (the library's `predict`, normalize=False): no sigmoid.
    Pairs within the maximum length (the library cuts longer ones its own way: docs/models.md)."""
    from mxbai_rerank import MxbaiRerankV2

    reference = MxbaiRerankV2(str(replicas[MXBAI_CATALOG]), device="cpu", torch_dtype=torch.float32)

    def prepare_for_model(first: list[int], second: list[int], *, max_length: int, **_: object) -> dict[str, list[int]]:
        # transformers 5's tokenizers dropped the method mxbai-rerank 0.1.6 joins a pair's ids with; within the length
        # (asserted), all it does is concatenate them.
        assert len(first) + len(second) <= max_length
        return {"input_ids": first + second}

    reference.tokenizer.prepare_for_model = prepare_for_model
    documents = [document for document in DOCUMENTS if len(document) < 200]
    expected = reference.predict([QUERY] * len(documents), documents, instruction=instruction).numpy()
    assert expected.min() < 0 or expected.max() > 1  # not probabilities: a sigmoid would fail below
    fields = {} if instruction is None else {"instruction": instruction}
    scores, ranking = served_scores(reranker_stub, MXBAI_CATALOG, documents, **fields)
    np.testing.assert_allclose(scores, expected, atol=1e-4, rtol=0)
    assert ranking == list(np.argsort(-expected, kind="stable"))


def test_instruction_replaces_the_default_one(reranker_stub) -> None:
    default, _ = served_scores(reranker_stub, QWEN3)
    instructed, _ = served_scores(reranker_stub, QWEN3, instruction=INSTRUCTION)
    assert np.abs(default - instructed).max() > 1e-3


def test_left_and_right_padding_give_the_same_scores(reranker_stub) -> None:
    right, _ = served_scores(reranker_stub, QWEN3)
    left, _ = served_scores(reranker_stub, QWEN3_LEFT)
    np.testing.assert_allclose(left, right, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    ("model", "cause"),
    [
        (BAD_TOKEN, "'certainly' is not one token"),  # a score token outside the vocabulary
        (CHAT_ONLY, "does not render 'query' and 'document' messages"),  # a chat template without the pair roles
        (BAD_PIECES, "load_options.template must be a text or a list of texts"),
    ],
)
def test_a_model_that_cannot_score_pairs_is_a_load_failure(reranker_stub, model: str, cause: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call_until_loaded(lambda: served_scores(reranker_stub, model))
    info, _ = error_details(caught.value)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert info is not None and info.reason == "MODEL_LOAD_FAILED"
    assert cause in caught.value.details()
