"""Our paths and the ceiling: the model called in-process, and the whole stack on loopback.

The stack is the one `sie up` starts (etcd, config service, one worker,
gateway, Envoy), so the worker is reached directly over gRPC, through the
gateway with the Python SDK, and through Envoy as HTTP/JSON. A tiny random
model is added beside MiniLM to measure what the gateway hop itself costs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import grpc
import numpy as np
import torch

from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import SIEClient
from sie_common.edge.auth import bearer_metadata
from sie_contract.tensors import from_tensor
from sie_stack.processes import ServiceProcess, free_port
from sie_stack.settings import StackSettings
from sie_stack.up import Stack

from http_client import json_sender
from workloads import MODEL, SINGLE_TEXT, Send, Workload

TINY = "bench/tiny-mean"
CEILING_BATCH_SIZES = (16, 32, 64, 128)


def best_batch_size(rate: Callable[[Sequence[str], int], float], texts: Sequence[str]) -> int:
    """Of CEILING_BATCH_SIZES, the one with the highest `rate` (items/s) on one pass over `texts` each."""
    rates = {size: rate(texts, size) for size in CEILING_BATCH_SIZES}
    return max(rates, key=rates.__getitem__)


class InProcess:
    """sentence-transformers called directly in this process: the ceiling every served path is held to."""

    def __init__(self, weights: Path, device: str = "cpu", attention: str | None = None) -> None:
        from sentence_transformers import SentenceTransformer

        model_kwargs = {"attn_implementation": attention} if attention else {}
        self.model = SentenceTransformer(str(weights), device=device, model_kwargs=model_kwargs)
        if device.startswith("cuda"):
            self.model.half()  # as the worker computes on accelerators (SIE_DEFAULT_COMPUTE_PRECISION=float16)
        self.torch_threads = torch.get_num_threads()
        self.batch_sizes: dict[str, int] = {}

    def best_batch_size(self, workload: Workload) -> int:
        """The batch size with the highest throughput on one pass of `workload` each."""
        if workload.name not in self.batch_sizes:
            self.model.encode(workload.texts[:128], batch_size=32)
            self.batch_sizes[workload.name] = best_batch_size(self._rate, workload.texts)
        return self.batch_sizes[workload.name]

    def throughput(self, workload: Workload) -> float:
        return self._rate(workload.texts, self.best_batch_size(workload))

    def _rate(self, texts: Sequence[str], batch_size: int) -> float:
        started = time.perf_counter()
        self.model.encode(list(texts), batch_size=batch_size)
        return len(texts) / (time.perf_counter() - started)

    def send(self, texts: Sequence[str]) -> int:
        return len(self.model.encode(list(texts)))

    def close(self) -> None:
        del self.model
        gc.collect()


def grpc_sender(address: str, model: str) -> Send:
    """Encode RPCs with generated stubs, one channel per client thread."""
    local = threading.local()

    def send(texts: Sequence[str]) -> int:
        stub = getattr(local, "stub", None)
        if stub is None:
            stub = local.stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(address))
        request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=text) for text in texts])
        return len(stub.Encode(request, timeout=600).results)

    return send


@dataclasses.dataclass
class Senders:
    worker: Send
    gateway_sdk: Send
    envoy_http: Send
    worker_tiny: Send
    gateway_tiny: Send
    worker_address: str
    gateway_address: str
    # Envoy's HTTP/JSON port on loopback.
    http_port: int
    # What a Work stream to that worker must present (the stack's SIE_WORKER_TOKEN).
    worker_token: str


@dataclasses.dataclass(frozen=True)
class Standalone:
    """A running standalone worker: Encode as a `Send`, the vectors themselves, and its log so far."""

    send: Send
    vectors: Callable[[Sequence[str]], np.ndarray]
    log: Callable[[], str]


@contextlib.contextmanager
def standalone_worker(tmp: Path, weights: Path, env: dict[str, str], name: str = "standalone-worker") -> Iterator[Standalone]:
    """A worker without etcd serving MODEL from `weights`, preloaded; `name` keeps several apart in `tmp`."""
    models = tmp / f"{name}-models"
    models.mkdir(exist_ok=True)
    (models / "bench-minilm.yaml").write_text(f"id: {MODEL}\npath: {weights}\nprofiles:\n  default:\n    adapter: sentence_transformer\n")
    worker = ServiceProcess({"SIE_PRELOAD_MODELS": MODEL, "SIE_MODELS_DIR": str(models), **env}, tmp / f"{name}.log")
    try:
        worker.wait_serving()
        yield Standalone(grpc_sender(worker.address, MODEL), functools.partial(dense_vectors, worker.address, MODEL), worker.log)
    finally:
        worker.stop()


def dense_vectors(address: str, model: str, texts: Sequence[str], per_request: int = 100) -> np.ndarray:
    """The dense vectors of `texts` from Encode, one row per text, `per_request` texts a request."""
    rows: list[np.ndarray] = []
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for start in range(0, len(texts), per_request):
            items = [types_pb2.Item(text=text) for text in texts[start : start + per_request]]
            results = stub.Encode(inference_pb2.EncodeRequest(model=model, items=items), timeout=600).results
            rows.extend(from_tensor(result.dense) for result in results)
    return np.stack(rows)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """`env` set for the processes started inside (the stack's services inherit this process's environment)."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def stack(tmp: Path, tiny_weights: Path, env: dict[str, str]) -> Iterator[Senders]:
    """The whole stack on free loopback ports, MiniLM preloaded and the tiny model added and warmed."""
    settings = StackSettings(
        state_dir=str(tmp / "stack"), workers=1, etcd_port=free_port(), config_port=free_port(), worker_port=free_port(),
        gateway_port=free_port(), http_port=free_port(), envoy_admin_port=free_port(), log_level="WARNING",
    )
    running = Stack(settings)
    sdk: SIEClient | None = None
    try:
        with _environment(env):
            running.up()
        with grpc.insecure_channel(f"127.0.0.1:{settings.config_port}") as channel:
            tiny = {"id": TINY, "path": str(tiny_weights), "profiles": {"default": {"adapter": "sentence_transformer"}}}
            request = config_pb2.AddModelRequest(config=tiny)
            config_pb2_grpc.ConfigServiceStub(channel).AddModel(request, timeout=30, metadata=bearer_metadata(running.admin_token))
        worker = f"127.0.0.1:{settings.worker_port}"
        gateway = f"127.0.0.1:{settings.gateway_port}"
        _wait_until_encodes(grpc_sender(gateway, TINY))
        sdk = SIEClient(gateway)
        client = sdk
        yield Senders(
            worker=grpc_sender(worker, MODEL),
            gateway_sdk=lambda texts: len(client.encode(MODEL, list(texts))),
            envoy_http=json_sender(settings.http_port, f"/v1/encode/{MODEL}", lambda texts: {"items": [{"text": t} for t in texts]}, "results"),
            worker_tiny=grpc_sender(worker, TINY),
            gateway_tiny=grpc_sender(gateway, TINY),
            worker_address=worker,
            gateway_address=gateway,
            http_port=settings.http_port,
            worker_token=running.worker_token,
        )
    finally:
        if sdk is not None:
            sdk.close()
        running.down()


def _wait_until_encodes(send: Send, timeout_s: float = 120) -> None:
    """Until the model answers (it loads on its first request and the gateway learns of it from etcd)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            send([SINGLE_TEXT])
            return
        except grpc.RpcError as error:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{TINY} did not answer within {timeout_s} s: {error}") from error
            time.sleep(0.5)
