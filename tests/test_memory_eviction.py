"""Memory pressure: three tiny models under a CPU budget that fits two.

The least recently used model is evicted before a load, the third serves, the
evicted one reloads on demand, and every answer equals sentence-transformers'.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from grpc_helpers import encode_request, encode_when_loaded, error_info, retry_delay_s
from sie.v1 import inference_pb2, inference_pb2_grpc

TEXTS = ["memory pressure evicts the least recently used model", "a second sentence", "x"]
A, B, C = "test/tiny-cls", "test/tiny-mean", "test/tiny-mean-no-prompt"
MODEL_MIB = 3.8  # each tiny model's parameters and buffers, float32


def states(stub) -> dict[str, int]:
    return {model.id: model.state for model in stub.ListModels(inference_pb2.ListModelsRequest()).models}


@pytest.fixture(scope="module")
def expected(tiny_models: dict[str, Path]) -> dict[str, np.ndarray]:
    """sentence-transformers' vectors (the worker puts the document prompt before non-query texts)."""
    return {
        model: SentenceTransformer(str(tiny_models[model]), device="cpu").encode(TEXTS, prompt_name="document")
        for model in (A, B, C)
    }


def assert_matches(served: np.ndarray, reference: np.ndarray) -> None:
    np.testing.assert_allclose(served, reference, atol=1e-5)


def test_lru_eviction_under_a_budget_that_fits_two(start_worker, expected) -> None:
    # 10 MiB at 100%: two 3.8 MiB models fit, a third does not.
    worker = start_worker(
        SIE_PRELOAD_MODELS="", SIE_MODEL_FILTER=f"{A},{B},{C}", SIE_CPU_MEMORY_BUDGET_MB="10", SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT="100"
    )
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert set(states(stub).values()) == {inference_pb2.MODEL_STATE_AVAILABLE}

        # The first request for a model that is not loaded starts the load and is told to come back.
        with pytest.raises(grpc.RpcError) as raised:
            stub.Encode(encode_request(A, TEXTS), timeout=60)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_info(raised.value).reason == "MODEL_LOADING"
        assert retry_delay_s(raised.value) > 0
        assert dict(raised.value.trailing_metadata())["retry-after"] >= "1"

        for model in (A, B):
            vectors, _ = encode_when_loaded(stub, model, TEXTS)
            assert_matches(vectors, expected[model])
        # A is used again, so B is now the least recently used.
        assert_matches(encode_when_loaded(stub, A, TEXTS)[0], expected[A])

        vectors, loading = encode_when_loaded(stub, C, TEXTS)
        assert_matches(vectors, expected[C])
        assert loading >= 1
        assert states(stub) == {
            A: inference_pb2.MODEL_STATE_LOADED,
            B: inference_pb2.MODEL_STATE_AVAILABLE,
            C: inference_pb2.MODEL_STATE_LOADED,
        }
        loaded = {model.id: model.memory_bytes for model in stub.ListModels(inference_pb2.ListModelsRequest()).models}
        assert 3 * 2**20 < loaded[A] < 5 * 2**20 and loaded[B] == 0
        assert loaded[A] + loaded[C] <= 10 * 2**20

        # B comes back on demand, evicting A (now the least recently used); answers unchanged.
        vectors, loading = encode_when_loaded(stub, B, TEXTS)
        assert_matches(vectors, expected[B])
        assert loading >= 1
        assert states(stub)[A] == inference_pb2.MODEL_STATE_AVAILABLE
        assert_matches(encode_when_loaded(stub, C, TEXTS)[0], expected[C])
        assert_matches(encode_when_loaded(stub, A, TEXTS)[0], expected[A])
    log = worker.log()
    assert log.count("evicting ") == 3
    # However many requests were told MODEL_LOADING, each load ran once: A and B twice (evicted in between), C once.
    assert [log.count(f"loaded {model} (profile default)") for model in (A, B, C)] == [2, 2, 1]


def test_idle_models_are_unloaded(start_worker) -> None:
    worker = start_worker(SIE_PRELOAD_MODELS=A, SIE_MODEL_FILTER=A, SIE_IDLE_EVICT_S="1", SIE_MEMORY_CHECK_INTERVAL_S="0.2")
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        encode_when_loaded(stub, A, TEXTS)
        deadline = time.monotonic() + 60
        while states(stub)[A] != inference_pb2.MODEL_STATE_AVAILABLE:
            assert time.monotonic() < deadline, "the idle model was never unloaded"
            time.sleep(0.2)
    assert "idle for more than 1 s" in worker.log()
