"""The Python SDK against a real standalone worker: results, dtypes, errors, retries, streaming."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from conftest import MINILM
from sie_client import AsyncSIEClient, Item, NotFoundError, RequestError, SIEClient

MODEL = "test/tiny-mean"


@pytest.fixture
def client(worker):
    with SIEClient(worker.address) as client:
        yield client


def test_one_item_in_one_result_out(client) -> None:
    result = client.encode(MINILM, Item(id="a", text="hello world"))
    assert result["id"] == "a"
    dense = result["dense"]
    assert dense.dtype == np.float32 and dense.shape == (384,)
    assert not dense.flags.writeable  # a view over the response bytes, not a copy
    assert abs(np.linalg.norm(dense) - 1) < 1e-5
    assert set(result["timing"]) == {"queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms", "total_ms"}


def test_a_list_in_a_list_out_in_order(client) -> None:
    texts = [f"sentence number {n}" for n in range(7)]
    results = client.encode(MODEL, [Item(id=str(n), text=t) for n, t in enumerate(texts)])
    assert [r["id"] for r in results] == [str(n) for n in range(7)]
    alone = [client.encode(MODEL, text)["dense"] for text in texts]  # plain strings work too
    np.testing.assert_allclose(np.stack([r["dense"] for r in results]), np.stack(alone), atol=1e-5)


def test_dtype_dims_and_query_flags_reach_the_server(client) -> None:
    half = client.encode(MINILM, "x", output_dtype="float16", dims=128)["dense"]
    assert half.dtype == np.float16 and half.shape == (128,)
    query = client.encode(MODEL, "x", is_query=True)["dense"]
    document = client.encode(MODEL, "x")["dense"]
    assert not np.allclose(query, document)  # the tiny models have different query and document prompts


def test_errors_map_to_classes_with_reason_and_are_not_retried(client) -> None:
    started = time.monotonic()
    with pytest.raises(NotFoundError) as missing:
        client.encode("no/such-model", "x")
    assert missing.value.reason == "MODEL_NOT_FOUND"
    assert "available:" in missing.value.message
    with pytest.raises(RequestError) as bad:
        client.encode(MODEL, "x", output_dtype="float64")
    assert bad.value.reason == "UNKNOWN_OUTPUT_DTYPE"
    assert time.monotonic() - started < 5  # answered at once, no backoff


def test_list_and_get_models(client) -> None:
    models = {model["id"]: model for model in client.list_models()}
    assert MINILM in models and MODEL in models
    assert client.get_model(MINILM)["dims"] == {"dense": 384}


def test_resource_exhausted_is_retried_with_backoff(start_worker) -> None:
    busy = start_worker(SIE_PRELOAD_MODELS=MODEL, SIE_MAX_CONCURRENT_REQUESTS="1", SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="400")
    with SIEClient(busy.address) as client:
        results: list = []
        threads = [threading.Thread(target=lambda: results.append(client.encode(MODEL, "contended"))) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    # Only one request fits at a time; the others got RESOURCE_EXHAUSTED and came back later.
    assert len(results) == 3


def test_ten_thousand_items_stream_back_complete_and_in_order(worker) -> None:
    texts = [f"streamed item {n} " + "word " * (n % 17) for n in range(10_000)]
    with SIEClient(worker.address, stream_batch_size=250, stream_window=6) as client:
        results = client.encode(MODEL, [Item(id=str(n), text=t) for n, t in enumerate(texts)])
        sample = [0, 1, 4_999, 9_998, 9_999]
        alone = [client.encode(MODEL, texts[n])["dense"] for n in sample]
    assert len(results) == 10_000
    assert [r["id"] for r in results] == [str(n) for n in range(10_000)]
    np.testing.assert_allclose(np.stack([results[n]["dense"] for n in sample]), np.stack(alone), atol=1e-5)


async def test_async_client_has_the_same_results(worker) -> None:
    async with AsyncSIEClient(worker.address) as client:
        single = await client.encode(MODEL, Item(id="q", text="async hello"))
        many = await client.encode(MODEL, ["async hello", "second"])
        models = await client.list_models()
    assert single["id"] == "q"
    np.testing.assert_allclose(single["dense"], many[0]["dense"], atol=1e-6)
    assert any(model["id"] == MODEL for model in models)
