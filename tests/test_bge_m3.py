"""BGE-M3 (adapter bge_m3) served by a real worker against FlagEmbedding's BGEM3FlagModel run in-process.

A tiny random XLM-RoBERTa replica (2 layers, a freshly trained Unigram tokenizer wrapped as XLM-R's, random
sparse_linear.pt and colbert_linear.pt) in the layout BAAI/bge-m3 ships. Dense and multivector vectors agree
with the reference at cosine >= 0.9999, sparse weights per token id within 1e-4 on the same ids, scores within
1e-4; for every combination of output types, queries and documents, and one LoRA adapter (a PeftModel over the
reference's transformer). With SIE_INSTRUMENTATION on, a request for all three outputs shows one forward pass
per batch in the worker's metrics.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from FlagEmbedding import BGEM3FlagModel
from google.protobuf import struct_pb2

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.cluster.model_config import load_model_config
from sie_contract.tensors import from_tensor
from test_observability import sample, scrape
from tiny_families import BGE_M3_HIDDEN as HIDDEN
from tiny_families import build_bge_m3_lora, build_tiny_bge_m3
from worker_process import Services, WorkerProcess, inference_stub

MODEL = "test/tiny-bge-m3"
NO_HEADS = "test/bge-m3-without-heads"
LORA = "tuned"
MAX_LENGTH = 40
OUTPUTS = ("dense", "sparse", "multivector")
TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "dense sparse and multivector retrieval from one model",
    "dog dog dog: a word three times gets its largest weight",
    "a",
    "ünïcödé and symbols ~ § that the tokenizer does not know",
    " ".join(["search engines rank documents"] * 30),  # truncated at MAX_LENGTH tokens
]
QUERY = "which engines rank documents by relevance"
PROMPT = "represent this query: "
@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bge-m3")
    model = build_tiny_bge_m3(root / "model")
    without_heads = root / "without-heads"
    shutil.copytree(model, without_heads, ignore=shutil.ignore_patterns("*_linear.pt"))
    return {"model": model, "lora": build_bge_m3_lora(root / "lora", model), "without_heads": without_heads}


@pytest.fixture(scope="module")
def bge_m3_worker(services: Services, tmp_path_factory: pytest.TempPathFactory, weights: dict[str, Path]) -> WorkerProcess:
    configs = tmp_path_factory.mktemp("bge-m3-configs")
    (configs / "bge-m3.yaml").write_text(
        f"id: {MODEL}\npath: {weights['model']}\ntasks: [encode, score]\noutput_types: [dense, sparse, multivector]\n"
        f"max_sequence_length: {MAX_LENGTH}\nloras:\n  {LORA}: {weights['lora']}\n"
        "profiles:\n  default:\n    adapter: bge_m3\n"
        "  lexical:\n    extends: default\n    run_options: {score_mode: sparse}\n"
        f"  prompted:\n    extends: default\n    run_options: {{query_prompt: '{PROMPT}'}}\n"
    )
    (configs / "no-heads.yaml").write_text(
        f"id: {NO_HEADS}\npath: {weights['without_heads']}\ntasks: [encode, score]\noutput_types: [dense, sparse, multivector]\n"
        "profiles:\n  default:\n    adapter: bge_m3\n"
    )
    return services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": MODEL, "SIE_INSTRUMENTATION": "true"}, name="bge-m3")


@pytest.fixture(scope="module")
def bge_m3_stub(bge_m3_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(bge_m3_worker) as stub:
        yield stub


def flag_model(directory: Path, **options):
    return BGEM3FlagModel(str(directory), use_fp16=False, devices="cpu", query_max_length=MAX_LENGTH, passage_max_length=MAX_LENGTH, **options)


@pytest.fixture(scope="module")
def reference(weights: dict[str, Path]):
    return flag_model(weights["model"])


@pytest.fixture(scope="module")
def lora_reference(weights: dict[str, Path]):
    from peft import PeftModel

    model = flag_model(weights["model"])
    model.model.model = PeftModel.from_pretrained(model.model.model, str(weights["lora"])).eval()
    return model


def expected(model, texts: list[str], *, is_query: bool) -> dict:
    encode = model.encode_queries if is_query else model.encode_corpus
    return encode(texts, return_dense=True, return_sparse=True, return_colbert_vecs=True)


def encode(stub, texts: list[str], outputs: tuple[str, ...], **fields) -> inference_pb2.EncodeResponse:
    request = inference_pb2.EncodeRequest(
        model=MODEL, items=[types_pb2.Item(id=str(i), text=text) for i, text in enumerate(texts)], output_types=outputs, **fields
    )
    response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=60))
    assert [result.id for result in response.results] == [str(i) for i in range(len(texts))]
    return response


def score(stub, options: dict | None = None, **fields) -> dict[int, float]:
    struct = struct_pb2.Struct()
    struct.update(options or {})
    request = inference_pb2.ScoreRequest(
        model=MODEL, query=types_pb2.Item(text=QUERY), items=[types_pb2.Item(text=text) for text in TEXTS], options=struct, **fields
    )
    response, _ = call_until_loaded(lambda: stub.Score(request, timeout=60))
    return {entry.index: entry.score for entry in response.scores}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def assert_matches(response: inference_pb2.EncodeResponse, reference: dict, outputs: tuple[str, ...]) -> None:
    for row, result in enumerate(response.results):
        assert result.HasField("dense") == ("dense" in outputs)
        assert result.HasField("sparse") == ("sparse" in outputs)
        assert result.HasField("multivector") == ("multivector" in outputs)
        if "dense" in outputs:
            dense = from_tensor(result.dense)
            assert dense.shape == (HIDDEN,)
            assert cosine(dense, reference["dense_vecs"][row]) >= 0.9999
        if "sparse" in outputs:
            weights = {int(token): float(weight) for token, weight in reference["lexical_weights"][row].items()}
            assert list(result.sparse.indices) == sorted(weights)
            np.testing.assert_allclose(list(result.sparse.values), [weights[token] for token in sorted(weights)], atol=1e-4)
        if "multivector" in outputs:
            vectors = from_tensor(result.multivector)
            assert vectors.shape == reference["colbert_vecs"][row].shape
            assert cosine(vectors, reference["colbert_vecs"][row]).min() >= 0.9999


COMBINATIONS = [combination for size in (1, 2, 3) for combination in itertools.combinations(OUTPUTS, size)]


@pytest.mark.parametrize("is_query", [False, True], ids=["document", "query"])
def test_every_combination_of_outputs_matches_flagembedding(bge_m3_stub, reference, is_query: bool) -> None:
    wanted = expected(reference, TEXTS, is_query=is_query)
    assert any(len(weights) for weights in wanted["lexical_weights"])  # some tokens weigh, ...
    assert wanted["colbert_vecs"][5].shape == (MAX_LENGTH - 1, HIDDEN)  # ... and the long text is truncated
    for outputs in COMBINATIONS:
        assert_matches(encode(bge_m3_stub, TEXTS, outputs, is_query=is_query), wanted, outputs)


def test_query_prompts_match_flagembedding_query_instructions(bge_m3_stub, weights: dict[str, Path]) -> None:
    """A profile's query_prompt, or a request's instruction, is the reference's query_instruction_for_retrieval."""
    wanted = expected(flag_model(weights["model"], query_instruction_for_retrieval=PROMPT), TEXTS, is_query=True)
    assert_matches(encode(bge_m3_stub, TEXTS, OUTPUTS, is_query=True, profile="prompted"), wanted, OUTPUTS)
    assert_matches(encode(bge_m3_stub, TEXTS, OUTPUTS, is_query=True, instruction=PROMPT), wanted, OUTPUTS)
    plain = from_tensor(encode(bge_m3_stub, TEXTS[:1], ("multivector",), is_query=True).results[0].multivector)
    assert len(plain) < len(wanted["colbert_vecs"][0])  # the prompt's tokens came first


def test_special_and_repeated_tokens_in_the_sparse_output(bge_m3_stub, reference) -> None:
    tokenizer = reference.tokenizer
    response = encode(bge_m3_stub, TEXTS, ("sparse",))
    assert all(result.sparse.dims == len(tokenizer) for result in response.results)  # the vocabulary size
    special = {tokenizer.cls_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    for text, result in zip(TEXTS, response.results):
        ids = tokenizer(text, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        assert not special & set(result.sparse.indices)
        assert set(result.sparse.indices) <= set(ids) - special
    assert tokenizer.unk_token_id in tokenizer(TEXTS[4])["input_ids"]  # the text with unknown symbols has <unk> ...
    assert len(set(response.results[4].sparse.indices)) == len(response.results[4].sparse.indices)  # ... and ids once


def test_lora_matches_flagembedding_over_a_peft_model(bge_m3_stub, reference, lora_reference) -> None:
    wanted = expected(lora_reference, TEXTS, is_query=False)
    response = encode(bge_m3_stub, TEXTS, OUTPUTS, lora=LORA)
    assert_matches(response, wanted, OUTPUTS)
    base = from_tensor(encode(bge_m3_stub, TEXTS[:1], ("dense",)).results[0].dense)
    assert cosine(base, from_tensor(response.results[0].dense)) < 0.9999  # the adapter changed the model


def reference_scores(model, weights: list[float]) -> dict[str, list[float]]:
    """FlagEmbedding's compute_score, one pair at a time (no passage padding in its MaxSim)."""
    scores = [
        model.compute_score(
            [(QUERY, text)], batch_size=1, max_query_length=MAX_LENGTH, max_passage_length=MAX_LENGTH, weights_for_different_modes=weights
        )
        for text in TEXTS
    ]
    return {mode: [pair[mode][0] for pair in scores] for mode in scores[0]}


def test_scores_match_flagembedding(bge_m3_stub, reference) -> None:
    wanted = reference_scores(reference, [1.0, 0.5, 2.0])
    query = expected(reference, [QUERY], is_query=True)
    documents = expected(reference, TEXTS, is_query=False)
    lexical = [reference.compute_lexical_matching_score(query["lexical_weights"][0], weights) for weights in documents["lexical_weights"]]
    colbert = [float(reference.colbert_score(query["colbert_vecs"][0], vectors)) for vectors in documents["colbert_vecs"]]
    np.testing.assert_allclose(wanted["sparse"], lexical, atol=1e-5)  # the reference's two ways agree
    np.testing.assert_allclose(wanted["colbert"], colbert, atol=1e-5)
    cases = {
        "dense": score(bge_m3_stub),  # the default
        "sparse": score(bge_m3_stub, {"score_mode": "sparse"}),
        "colbert": score(bge_m3_stub, {"score_mode": "multivector"}),
        "colbert+sparse+dense": score(bge_m3_stub, {"score_mode": "hybrid", "score_weights": {"dense": 1.0, "sparse": 0.5, "multivector": 2.0}}),
    }
    for mode, served in cases.items():
        assert sorted(served) == list(range(len(TEXTS)))
        np.testing.assert_allclose([served[index] for index in range(len(TEXTS))], wanted[mode], atol=1e-4, err_msg=mode)
    assert score(bge_m3_stub, {"score_mode": "colbert"}) == cases["colbert"]  # the reference system's name for it
    assert score(bge_m3_stub, profile="lexical") == cases["sparse"]  # a profile's run_options pick the default
    assert score(bge_m3_stub, {"score_mode": "dense"}, profile="lexical") == cases["dense"]  # the request's options win


def test_a_score_instruction_is_the_querys_only(bge_m3_stub, weights: dict[str, Path]) -> None:
    """FlagEmbedding puts its query instruction before queries, never before the documents they are scored against."""
    model = flag_model(weights["model"], query_instruction_for_retrieval=PROMPT)
    query = expected(model, [QUERY], is_query=True)
    documents = expected(model, TEXTS, is_query=False)
    dense = documents["dense_vecs"] @ query["dense_vecs"][0]
    # Sparse weights show it best: the instruction's words would match themselves on both sides.
    lexical = [model.compute_lexical_matching_score(query["lexical_weights"][0], weights) for weights in documents["lexical_weights"]]
    for options, wanted in (({}, dense), ({"score_mode": "sparse"}, lexical)):
        served = score(bge_m3_stub, options, instruction=PROMPT)
        np.testing.assert_allclose([served[index] for index in range(len(TEXTS))], wanted, atol=1e-4)
        assert served != score(bge_m3_stub, options)  # the instruction did reach the query


def test_hybrid_defaults_to_the_paper_weights(bge_m3_stub, reference) -> None:
    wanted = reference_scores(reference, [0.4, 0.2, 0.4])
    served = score(bge_m3_stub, {"score_mode": "hybrid"})
    np.testing.assert_allclose([served[index] for index in range(len(TEXTS))], wanted["colbert+sparse+dense"], atol=1e-4)


def test_lora_scores_match_flagembedding(bge_m3_stub, lora_reference) -> None:
    wanted = reference_scores(lora_reference, [1.0, 1.0, 1.0])
    served = score(bge_m3_stub, {"score_mode": "sparse"}, lora=LORA)
    np.testing.assert_allclose([served[index] for index in range(len(TEXTS))], wanted["sparse"], atol=1e-4)


@pytest.mark.parametrize(
    "options, problem",
    [
        ({"score_mode": "cosine"}, "score_mode must be one of dense, sparse, multivector, hybrid"),
        ({"score_mode": 3}, "score_mode must be one of"),
        ({"score_mode": "hybrid", "score_weights": {"dense": -1}}, "score_weights.dense: must be a finite number >= 0"),
        ({"score_weights": {"title": 1}}, "score_weights.title: unknown"),
        ({"score_weights": [1, 2]}, "score_weights must be a mapping"),
        ({"score_mode": "hybrid", "score_weights": {"dense": 0, "sparse": 0, "multivector": 0}}, "need a weight above 0"),
    ],
)
def test_bad_score_options_are_invalid_argument(bge_m3_stub, options: dict, problem: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        score(bge_m3_stub, options)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "INVALID_OPTIONS"
    assert problem in raised.value.details()


def test_a_checkpoint_without_its_heads_fails_to_load_naming_them(bge_m3_stub) -> None:
    request = inference_pb2.EncodeRequest(model=NO_HEADS, items=[types_pb2.Item(text="x")])
    with pytest.raises(grpc.RpcError) as raised:
        call_until_loaded(lambda: bge_m3_stub.Encode(request, timeout=60))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "sparse_linear.pt is missing" in raised.value.details()


def test_all_three_outputs_take_one_forward_pass_per_batch(bge_m3_worker: WorkerProcess, bge_m3_stub) -> None:
    """The worker's count of forward passes (sie_worker_batch_items_count, GetModel's stats) rises by the batches
    the request's debug statistics list, and those hold each item once: not once per output type."""
    labels = {"model": MODEL, "profile": "default"}
    for outputs in (("dense",), OUTPUTS):
        passes_before = sample(scrape(bge_m3_worker), "sie_worker_batch_items_count", **labels)
        stats_before = bge_m3_stub.GetModel(inference_pb2.GetModelRequest(model=MODEL)).model.stats.forward_passes
        response = encode(bge_m3_stub, TEXTS, outputs, debug=True)
        batches = response.timing.batches
        assert sum(batch.items for batch in batches) == len(TEXTS)
        assert sample(scrape(bge_m3_worker), "sie_worker_batch_items_count", **labels) - passes_before == len(batches)
        assert bge_m3_stub.GetModel(inference_pb2.GetModelRequest(model=MODEL)).model.stats.forward_passes - stats_before == len(batches)


def test_the_adapter_runs_the_transformer_once_for_all_three_outputs(weights: dict[str, Path], tmp_path: Path) -> None:
    """Inside a batch: one call of the transformer whatever the outputs asked (a forward hook counts them)."""
    from sie_worker.adapters.contract import Input, LoadContext, Query
    from sie_worker.adapters.families.bge_m3 import BgeM3Encoder

    config_file = tmp_path / "m3.yaml"
    config_file.write_text(f"id: {MODEL}\npath: {weights['model']}\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: bge_m3\n")
    config = load_model_config(config_file)
    context = LoadContext(config, config.profile(), weights["model"], torch.device("cpu"), torch.float32, "sdpa", False, True)
    adapter = BgeM3Encoder(context)
    calls = []
    adapter.model.register_forward_hook(lambda *_: calls.append(1))
    query = Query("encode", outputs=OUTPUTS)
    with torch.inference_mode():  # as the engine's device loop runs it
        items = adapter.run([ready.value for ready in adapter.prepare([Input(text) for text in TEXTS], query)], query)
    assert len(calls) == 1
    assert all(item.dense is not None and item.sparse is not None and item.multivector is not None for item in items)
