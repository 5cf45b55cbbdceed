"""The client on every output type, dtype and operation, sync and async, against a real worker."""

from __future__ import annotations

import numpy as np
import pytest

from sie_client import AsyncSIEClient, Item, SIEClient, dequantize

MEAN = "test/tiny-mean"


@pytest.fixture
def client(worker):
    with SIEClient(worker.address) as client:
        yield client


@pytest.mark.parametrize(
    ("dtype", "numpy_dtype", "width"),
    [("float32", np.float32, 32), ("float16", np.float16, 32), ("int8", np.int8, 32), ("uint8", np.uint8, 32), ("binary", np.int8, 4), ("ubinary", np.uint8, 4)],
)
def test_dense_dtypes_and_shapes(client, dtype: str, numpy_dtype: type, width: int) -> None:
    reference = client.encode(MEAN, "dtype check")["dense"]
    result = client.encode(MEAN, "dtype check", output_dtype=dtype)
    assert result["dense"].dtype == numpy_dtype and result["dense"].shape == (width,)
    if dtype in ("int8", "uint8"):
        assert result["dense_scale"].shape == (1,)
        np.testing.assert_allclose(dequantize(result), reference, atol=float(result["dense_scale"][0]))
    if dtype in ("binary", "ubinary"):
        bits = np.unpackbits(result["dense"].view(np.uint8))
        np.testing.assert_array_equal(bits.astype(bool), reference > 0)


def test_sparse_and_multivector(client) -> None:
    sparse = client.encode("test/tiny-splade", "sparse words here", output_types=["sparse"])["sparse"]
    assert sparse["indices"].dtype == np.int32 and sparse["values"].dtype == np.float32  # the reference's SparseResult
    assert sparse["indices"].shape == sparse["values"].shape and len(sparse["indices"]) > 0
    both = client.encode("test/tiny-colbert", ["a document", "another one here"], output_types=["multivector", "dense"])
    for result in both:
        assert result["multivector"].ndim == 2 and result["multivector"].dtype == np.float32
        assert result["dense"].ndim == 1
    quantized = client.encode("test/tiny-colbert", "a document", output_types=["multivector"], output_dtype="int8")
    tokens = quantized["multivector"].shape[0]
    assert quantized["multivector_scale"].shape == (tokens,)
    assert dequantize(quantized, "multivector").shape == quantized["multivector"].shape


def test_score_and_extract(client) -> None:
    ranked = client.score("test/tiny-reranker", "what is vector search", [Item(id="a", text="vectors"), Item(id="b", text="bananas")], top_k=2)
    assert sorted(s["item_id"] for s in ranked["scores"]) == ["a", "b"] and [s["rank"] for s in ranked["scores"]] == [0, 1]
    one = client.extract("test/tiny-ner", Item(id="t", text="Ada Lovelace lived in London"))
    assert one["id"] == "t" and all("Ada Lovelace lived in London"[e["start"]:e["end"]] == e["text"] for e in one["entities"])
    many = client.extract("test/tiny-ner", ["first text", "second text"])
    assert len(many) == 2


async def test_async_client_score_extract_and_dtypes(worker) -> None:
    async with AsyncSIEClient(worker.address) as client:
        ranked = await client.score("test/tiny-reranker", "query", ["x", "y", "z"], top_k=1)
        extracted = await client.extract("test/tiny-ner", ["Paris is in France"])
        half = await client.encode(MEAN, "async half", output_dtype="float16")
    assert len(ranked["scores"]) == 1
    assert extracted[0]["id"] == "item-0"  # as score names an item without an id
    assert half["dense"].dtype == np.float16
