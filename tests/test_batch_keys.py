"""Concurrent requests that differ in LoRA or options never share a forward pass, and each gets its own right answer.

`batching_stub` waits 300 ms for batches to fill, so requests sent together meet in
the BatchFormer: one forward pass when their batch keys agree, one each when not
(read from the model's forward-pass counter).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from conftest import LORA_MODEL
from grpc_helpers import call_until_loaded, forward_passes, items, stacked
from sie.v1 import inference_pb2
from test_lora import TEXTS, reference


def concurrently(stub, model: str, requests: list[Callable[[], np.ndarray]]) -> tuple[int, list[np.ndarray]]:
    """Send the requests at once; the forward passes they took and their answers."""
    before = forward_passes(stub, model)
    results: list[np.ndarray] = [np.empty(0)] * len(requests)
    barrier = threading.Barrier(len(requests))

    def run(index: int) -> None:
        barrier.wait()
        results[index] = requests[index]()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return forward_passes(stub, model) - before, results


def test_requests_with_different_loras_never_share_a_batch(batching_stub, tiny_models) -> None:
    def encode(lora: str) -> Callable[[], np.ndarray]:
        request = inference_pb2.EncodeRequest(model=LORA_MODEL, items=items(TEXTS[:1]), lora=lora)
        return lambda: stacked(result.dense for result in batching_stub.Encode(request, timeout=60).results)

    for name in ("alpha", "beta"):
        call_until_loaded(encode(name))
    base = tiny_models["test/tiny-mean"]
    expected = {name: reference(base, tiny_models[f"lora/{name}"], TEXTS[:1]) for name in ("alpha", "beta")}

    passes, _ = concurrently(batching_stub, LORA_MODEL, [encode("alpha"), encode("alpha")])
    assert passes == 1, "control: the same adapter shares one forward pass"
    passes, (alpha, beta) = concurrently(batching_stub, LORA_MODEL, [encode("alpha"), encode("beta")])
    assert passes == 2
    np.testing.assert_allclose(alpha, expected["alpha"], atol=1e-5)
    np.testing.assert_allclose(beta, expected["beta"], atol=1e-5)


def test_requests_with_different_options_never_share_a_batch(batching_stub) -> None:
    model = "test/tiny-colbert"

    def encode(seed: int) -> Callable[[], np.ndarray]:
        request = inference_pb2.EncodeRequest(model=model, items=items(TEXTS[:1]), output_types=["dense"])
        request.options.update({"muvera": {"seed": seed}})
        return lambda: stacked(result.dense for result in batching_stub.Encode(request, timeout=60).results)

    alone = {seed: encode(seed)() for seed in (1, 2)}
    assert not np.allclose(alone[1], alone[2])

    passes, _ = concurrently(batching_stub, model, [encode(1), encode(1)])
    assert passes == 1, "control: equal options share one forward pass"
    passes, (first, second) = concurrently(batching_stub, model, [encode(1), encode(2)])
    assert passes == 2
    np.testing.assert_array_equal(first, alone[1])
    np.testing.assert_array_equal(second, alone[2])
