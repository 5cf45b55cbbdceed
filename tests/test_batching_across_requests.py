"""Concurrent requests from separate clients share forward passes and get their own items back."""

from __future__ import annotations

import threading

import grpc
import numpy as np

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor

MODEL = "test/tiny-mean"
CLIENTS = 8
ITEMS_PER_CLIENT = 5


def client_texts(client: int) -> list[str]:
    return [f"client {client} item {index} " + "word " * (client + index) for index in range(ITEMS_PER_CLIENT)]


def encode(address: str, texts: list[str]) -> np.ndarray:
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        response = stub.Encode(
            inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(id=text, text=text) for text in texts]),
            timeout=60,
        )
    assert [result.id for result in response.results] == texts
    return np.stack([from_tensor(result.dense) for result in response.results])


def forward_passes(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        model = inference_pb2_grpc.InferenceStub(channel).GetModel(inference_pb2.GetModelRequest(model=MODEL))
    return model.model.stats.forward_passes


def test_concurrent_clients_share_forward_passes(start_worker) -> None:
    # A wide wait window so the requests of all clients meet in the BatchFormer.
    worker = start_worker(SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="300", SIE_PRELOAD_MODELS=MODEL)
    expected = {client: encode(worker.address, client_texts(client)) for client in range(CLIENTS)}
    passes_before = forward_passes(worker.address)

    results: dict[int, np.ndarray] = {}
    barrier = threading.Barrier(CLIENTS)

    def run(client: int) -> None:
        barrier.wait()
        results[client] = encode(worker.address, client_texts(client))

    threads = [threading.Thread(target=run, args=(client,)) for client in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    passes = forward_passes(worker.address) - passes_before
    assert 1 <= passes < CLIENTS, f"{CLIENTS} concurrent requests took {passes} forward passes"
    for client in range(CLIENTS):
        # Each caller got its own items, in its own order, equal to encoding them alone.
        np.testing.assert_allclose(results[client], expected[client], atol=1e-5)
