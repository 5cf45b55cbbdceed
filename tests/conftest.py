from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from sie.v1 import inference_pb2_grpc
from sie_common.cluster.etcd import Etcd
from sie_stack.processes import EtcdProcess
from tiny_models import (
    VARIANTS,
    build_tiny_clip,
    build_tiny_colbert,
    build_tiny_head_model,
    build_tiny_lora,
    build_tiny_model,
    build_tiny_siglip,
    write_config,
    write_model_yaml,
)
from worker_process import WorkerProcess, free_port, stop_all

# The suite compares what workers serve with the reference libraries at float32 tolerances, so every worker and
# engine it starts computes in float32 whatever the CPU (on an AMX machine, `auto` would pick bfloat16).
# tests/test_cpu_precision.py asks for the other precisions explicitly.
os.environ.setdefault("SIE_CPU_COMPUTE_PRECISION", "float32")

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
LORA_MODEL = "test/tiny-mean-lora"
LORAS = ("alpha", "beta", "gamma")
# Model id -> YAML body after `path:`, for the models of the other operations and output types.
OPERATION_MODELS = {
    "test/tiny-splade": "tasks: [encode]\noutput_types: [sparse]\nprofiles:\n  default:\n    adapter: splade\n",
    "test/tiny-colbert": (
        "tasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n  default:\n    adapter: colbert\n"
        "    load_options: {query_length: 12}\n"
        "    run_options:\n      muvera: {k_sim: 3, d_proj: 8, repetitions: 20, seed: 7}\n"
    ),
    "test/tiny-reranker": "tasks: [score]\nprofiles:\n  default:\n    adapter: cross_encoder\n",
    "test/tiny-ner": "tasks: [extract]\nprofiles:\n  default:\n    adapter: token_classifier\n",
    # A dual encoder; profile `raw` leaves its embeddings unnormalized.
    "test/tiny-clip": (
        "inputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n"
        "  raw:\n    extends: default\n    load_options: {normalize: false}\n"
    ),
    "test/tiny-siglip": "inputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n",
}
# Served but never preloaded: its config asks its adapter for a task it lacks.
MISCONFIGURED_MODEL = "test/splade-as-reranker"


@pytest.fixture(scope="session", autouse=True)
def weight_roots(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers the tests start may read weights from the session's temporary directory (SIE_WEIGHT_ROOTS)."""
    previous = os.environ.get("SIE_WEIGHT_ROOTS")
    os.environ["SIE_WEIGHT_ROOTS"] = str(tmp_path_factory.getbasetemp())
    yield
    if previous is None:
        os.environ.pop("SIE_WEIGHT_ROOTS", None)
    else:
        os.environ["SIE_WEIGHT_ROOTS"] = previous


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model id -> directory for each tiny variant."""
    root = tmp_path_factory.mktemp("tiny-models")
    built = {}
    for name, (pooling, normalize, include_prompt) in VARIANTS.items():
        built[f"test/{name}"] = build_tiny_model(
            root / name, pooling=pooling, normalize=normalize, include_prompt=include_prompt
        )
    built["test/tiny-splade"] = build_tiny_head_model(root / "splade", "masked_lm")
    built["test/tiny-reranker"] = build_tiny_head_model(root / "reranker", "reranker")
    built["test/tiny-ner"] = build_tiny_head_model(root / "ner", "ner")
    built["test/tiny-colbert"] = build_tiny_colbert(root / "colbert")
    built["test/tiny-clip"] = build_tiny_clip(root / "clip")
    built["test/tiny-siglip"] = build_tiny_siglip(root / "siglip")
    for seed, name in enumerate(LORAS, start=1):
        built[f"lora/{name}"] = build_tiny_lora(root / "loras" / name, built["test/tiny-mean"], seed=seed)
    return built


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    directory = tmp_path_factory.mktemp("model-configs")
    for name in VARIANTS:
        write_model_yaml(directory, f"test/{name}", tiny_models[f"test/{name}"])
    for model_id, body in OPERATION_MODELS.items():
        write_config(directory, model_id, f"path: {tiny_models[model_id]}\n{body}")
    loras = "".join(f"  {name}: {tiny_models[f'lora/{name}']}\n" for name in LORAS)
    write_config(
        directory,
        LORA_MODEL,
        f"path: {tiny_models['test/tiny-mean']}\nloras:\n{loras}profiles:\n  default:\n    adapter: sentence_transformer\n",
    )
    write_config(
        directory,
        MISCONFIGURED_MODEL,
        f"path: {tiny_models['test/tiny-splade']}\ntasks: [score]\nprofiles:\n  default:\n    adapter: splade\n",
    )
    return directory


@pytest.fixture(scope="session")
def start_worker(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator:
    """Start workers with extra env; all are stopped at the end of the session."""
    started: list[WorkerProcess] = []

    every_model = ",".join([MINILM, *(f"test/{name}" for name in VARIANTS), *OPERATION_MODELS, LORA_MODEL])

    def start(**env: str) -> WorkerProcess:
        """A worker with every test model preloaded unless `SIE_PRELOAD_MODELS` says otherwise."""
        log = tmp_path_factory.mktemp("worker-logs") / "worker.log"
        worker = WorkerProcess({"SIE_MODELS_DIR": str(models_dir), "SIE_PRELOAD_MODELS": every_model, **env}, log)
        started.append(worker)
        worker.wait_serving()
        return worker

    yield start
    stop_all(started)


@pytest.fixture(scope="session")
def worker(start_worker) -> WorkerProcess:
    """One shared worker with default settings."""
    return start_worker()


@pytest.fixture(scope="session")
def batching_stub(start_worker) -> Iterator[inference_pb2_grpc.InferenceStub]:
    """A worker that keeps at most 2 LoRA adapters and waits 300 ms for batches, so concurrent requests meet."""
    worker = start_worker(
        SIE_MAX_LORAS_PER_MODEL="2",
        SIE_ADAPTIVE_BATCHING="false",
        SIE_MAX_BATCH_WAIT_MS="300",
        SIE_PRELOAD_MODELS=f"{LORA_MODEL},test/tiny-colbert",
    )
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@pytest.fixture
def stub(worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


@dataclass(frozen=True)
class S3Server:
    endpoint_url: str

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3-compatible server (moto in server mode) on loopback; AWS_* test credentials in the environment."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1", AWS_MAX_ATTEMPTS="2"
    )
    port = free_port()
    log = open(tmp_path_factory.mktemp("s3-server") / "moto.log", "wb")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    server = S3Server(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while True:
        try:
            server.client().list_buckets()
            break
        except Exception:
            if process.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield server
    process.terminate()
    process.wait(timeout=30)
    log.close()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    """One real etcd on loopback for the session; tests keep apart by key prefix."""
    root = tmp_path_factory.mktemp("etcd")
    server = EtcdProcess(root / "data", root / "etcd.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def etcd_prefix() -> str:
    return f"/sie-test-{uuid.uuid4().hex[:8]}/"


@pytest.fixture
async def etcd(etcd_server: EtcdProcess, etcd_prefix: str) -> AsyncIterator[Etcd]:
    """A client of the session etcd under this test's prefix."""
    client = Etcd([etcd_server.endpoint], etcd_prefix)
    await client.connect()
    yield client
    await client.close()


@pytest.fixture
def start_config(
    tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdProcess, etcd_prefix: str
) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `sie-config serve` replicas on this test's prefix; all are stopped when the test ends."""
    started: list[WorkerProcess] = []

    def start(**env: str) -> WorkerProcess:
        log = tmp_path_factory.mktemp("config-logs") / "config.log"
        # Loopback replicas: tests add models without an admin token unless they set SIE_ADMIN_TOKEN.
        defaults = {
            "SIE_ETCD_ENDPOINTS": etcd_server.endpoint,
            "SIE_ETCD_PREFIX": etcd_prefix,
            "SIE_CONFIG_LEADER_TTL_S": "3",
            "SIE_ALLOW_UNAUTHENTICATED_ADMIN": "true",
        }
        replica = WorkerProcess({**defaults, **env}, log, module="sie_config")
        started.append(replica)
        replica.wait_serving(timeout_s=60)
        return replica

    yield start
    stop_all(started)


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdProcess, etcd_prefix: str, tiny_models: dict[str, Path], start_config):
    """Config service with the tiny models added; start workers and gateways with cluster.start_*()."""
    from local_cluster import Cluster, model_config

    models = [model_config(model_id, tiny_models[model_id]) for model_id in ("test/tiny-mean", "test/tiny-cls")]
    running = Cluster(tmp_path, etcd_server.endpoint, etcd_prefix, models, start_config)
    yield running
    running.stop()
