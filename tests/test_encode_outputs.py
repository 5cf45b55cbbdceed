"""Sparse, multivector, MUVERA, dims and every output dtype, each against a reference computed here."""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertModel

from grpc_helpers import items
from sie.v1 import inference_pb2
from sie_contract.tensors import decode_tensor, from_tensor

TEXTS = ["the quick brown fox jumps over the lazy dog.", "hello, world!", "search engines rank documents"]
QUERY_LENGTH = 12  # the tiny ColBERT's load_options


def encode(stub, model: str, texts=TEXTS, **fields) -> inference_pb2.EncodeResponse:
    return stub.Encode(inference_pb2.EncodeRequest(model=model, items=items(texts), **fields), timeout=60)


# --- sparse ---------------------------------------------------------------------------------------


def splade_reference(directory: Path, texts: list[str]) -> np.ndarray:
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForMaskedLM.from_pretrained(directory).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.inference_mode():
        logits = model(**batch).logits
    weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"].unsqueeze(-1)
    return weights.max(dim=1).values.numpy()


def test_sparse_equals_splade_computed_with_transformers(stub, tiny_models) -> None:
    response = encode(stub, "test/tiny-splade", output_types=["sparse"])
    expected = splade_reference(tiny_models["test/tiny-splade"], TEXTS)
    for result, row in zip(response.results, expected):
        sparse = result.sparse
        assert sparse.dims == row.shape[0]
        assert list(sparse.indices) == sorted(sparse.indices) and all(value > 0 for value in sparse.values)
        served = np.zeros(sparse.dims, dtype=np.float32)
        served[list(sparse.indices)] = sparse.values
        np.testing.assert_allclose(served, row, atol=1e-5)
        assert not result.HasField("dense")


# --- multivector ----------------------------------------------------------------------------------


def colbert_reference(directory: Path, texts: list[str], *, is_query: bool) -> list[np.ndarray]:
    """ColBERT encoding from its definition: marker after [CLS], [MASK] query expansion, projection, punctuation masked."""
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = BertModel.from_pretrained(directory).eval()
    projection = load_file(str(directory / "1_Dense" / "model.safetensors"))["linear.weight"]
    marker = tokenizer.convert_tokens_to_ids("[unused0]" if is_query else "[unused1]")
    punctuation = {tokenizer.convert_tokens_to_ids(symbol) for symbol in string.punctuation}
    vectors = []
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        ids = [ids[0], marker, *ids[1:]]
        attention = [1] * len(ids)
        if is_query:
            ids = ids[: QUERY_LENGTH - 1] + [ids[-1]] if len(ids) > QUERY_LENGTH else ids
            attention = [1] * len(ids) + [0] * (QUERY_LENGTH - len(ids))
            ids = ids + [tokenizer.mask_token_id] * (QUERY_LENGTH - len(ids))
        with torch.inference_mode():
            hidden = model(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([attention])).last_hidden_state[0]
        projected = torch.nn.functional.normalize(hidden @ projection.T, dim=-1).numpy()
        keep = [position for position, token in enumerate(ids) if is_query or token not in punctuation]
        vectors.append(projected[keep])
    return vectors


@pytest.mark.parametrize("is_query", [False, True], ids=["documents", "queries"])
def test_multivector_equals_colbert_reference(stub, tiny_models, is_query: bool) -> None:
    response = encode(stub, "test/tiny-colbert", output_types=["multivector"], is_query=is_query)
    expected = colbert_reference(tiny_models["test/tiny-colbert"], TEXTS, is_query=is_query)
    for result, vectors in zip(response.results, expected):
        served = from_tensor(result.multivector)
        assert served.shape == vectors.shape
        np.testing.assert_allclose(served, vectors, atol=1e-5)
    if is_query:
        assert all(from_tensor(result.multivector).shape[0] == QUERY_LENGTH for result in response.results)


# --- dims and dtypes ------------------------------------------------------------------------------


def test_dims_truncates_and_renormalizes(stub) -> None:
    full = np.stack([from_tensor(r.dense) for r in encode(stub, "test/tiny-mean").results])
    cut = np.stack([from_tensor(r.dense) for r in encode(stub, "test/tiny-mean", dims=8).results])
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, expected, atol=1e-6)


@pytest.mark.parametrize("output_type", ["dense", "multivector"])
@pytest.mark.parametrize("dtype", ["float16", "int8", "uint8", "binary", "ubinary"])
def test_output_dtypes_match_numpy_and_decode_within_their_bound(stub, dtype: str, output_type: str) -> None:
    model = "test/tiny-mean" if output_type == "dense" else "test/tiny-colbert"
    exact = [from_tensor(getattr(r, output_type)) for r in encode(stub, model, output_types=[output_type]).results]
    for result, reference in zip(encode(stub, model, output_types=[output_type], output_dtype=dtype).results, exact):
        tensor = getattr(result, output_type)
        assert tensor.dtype == dtype
        values = from_tensor(tensor)
        if dtype == "float16":
            np.testing.assert_array_equal(values, reference.astype(np.float16))
        elif dtype in ("binary", "ubinary"):
            assert values.dtype == (np.int8 if dtype == "binary" else np.uint8)
            np.testing.assert_array_equal(np.unpackbits(values.view(np.uint8), axis=-1)[..., : reference.shape[-1]], reference > 0)
        else:
            rows = reference.reshape(-1, reference.shape[-1])
            assert len(tensor.scale) == rows.shape[0]
            scale = np.asarray(tensor.scale, dtype=np.float32).reshape(reference.shape[:-1] + (1,))
            if dtype == "int8":
                assert not tensor.offset
                np.testing.assert_allclose(scale[..., 0], np.abs(reference).max(axis=-1) / 127, rtol=1e-6)
            else:
                np.testing.assert_allclose(tensor.offset, rows.min(axis=-1), rtol=1e-6)
            decoded = decode_tensor(tensor)
            # The documented bound: within half a quantization step of the original.
            assert np.all(np.abs(decoded - reference) <= scale / 2 + 1e-6)


# --- MUVERA ---------------------------------------------------------------------------------------

def test_muvera_dense_is_deterministic_sized_by_config_and_overridable(stub) -> None:
    def dense(**fields) -> np.ndarray:
        response = encode(stub, "test/tiny-colbert", output_types=["dense"], **fields)
        return np.stack([from_tensor(r.dense) for r in response.results])

    documents = dense()
    assert documents.shape == (len(TEXTS), 20 * 2**3 * 8)  # repetitions x 2^k_sim x d_proj from the model config
    np.testing.assert_array_equal(dense(), documents)
    assert not np.allclose(dense(is_query=True), documents), "queries sum, documents average"

    options = inference_pb2.EncodeRequest().options
    options.update({"muvera": {"seed": 8}})
    reseeded = dense(options=options)
    assert reseeded.shape == documents.shape and not np.allclose(reseeded, documents)
    np.testing.assert_array_equal(dense(options=options), reseeded)
    options.update({"muvera": {"repetitions": 2}})
    assert dense(options=options).shape == (len(TEXTS), 2 * 2**3 * 8)
