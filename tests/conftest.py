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

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))

from etcd_process import EtcdProcess  # noqa: E402
from sie.v1 import inference_pb2_grpc  # noqa: E402
from sie_common.etcd import Etcd  # noqa: E402
from tiny_models import VARIANTS, build_tiny_model, write_model_yaml  # noqa: E402
from worker_process import WorkerProcess, free_port  # noqa: E402

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model id -> directory for each tiny variant."""
    root = tmp_path_factory.mktemp("tiny-models")
    built = {}
    for name, (pooling, normalize, include_prompt) in VARIANTS.items():
        built[f"test/{name}"] = build_tiny_model(root / name, pooling=pooling, normalize=normalize, include_prompt=include_prompt)
    return built


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, Path]) -> Path:
    directory = tmp_path_factory.mktemp("model-configs")
    for model_id, weights in tiny_models.items():
        write_model_yaml(directory, model_id, weights)
    return directory


@pytest.fixture(scope="session")
def start_worker(tmp_path_factory: pytest.TempPathFactory, models_dir: Path) -> Iterator:
    """Start workers with extra env; all are stopped at the end of the session."""
    started: list[WorkerProcess] = []

    every_model = ",".join([MINILM, *(f"test/{name}" for name in VARIANTS)])

    def start(**env: str) -> WorkerProcess:
        """A worker with every test model preloaded unless `SIE_PRELOAD_MODELS` says otherwise."""
        log = tmp_path_factory.mktemp("worker-logs") / "worker.log"
        worker = WorkerProcess({"SIE_MODELS_DIR": str(models_dir), "SIE_PRELOAD_MODELS": every_model, **env}, log)
        started.append(worker)
        worker.wait_serving()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def worker(start_worker) -> WorkerProcess:
    """One shared worker with default settings."""
    return start_worker()


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
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
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
def start_config(tmp_path_factory: pytest.TempPathFactory, etcd_server: EtcdProcess, etcd_prefix: str) -> Iterator[Callable[..., WorkerProcess]]:
    """Start `sie-config serve` replicas on this test's prefix; all are stopped when the test ends."""
    started: list[WorkerProcess] = []

    def start(**env: str) -> WorkerProcess:
        log = tmp_path_factory.mktemp("config-logs") / "config.log"
        defaults = {"SIE_ETCD_ENDPOINTS": etcd_server.endpoint, "SIE_ETCD_PREFIX": etcd_prefix, "SIE_CONFIG_LEADER_TTL_S": "3"}
        replica = WorkerProcess({**defaults, **env}, log, module="sie_config")
        started.append(replica)
        replica.wait_serving(timeout_s=60)
        return replica

    yield start
    for replica in started:
        replica.stop()


@pytest.fixture
def cluster(tmp_path: Path, etcd_server: EtcdProcess, etcd_prefix: str, tiny_models: dict[str, Path], start_config):
    """Config service with the tiny models added; start workers and gateways with cluster.start_*()."""
    from local_cluster import Cluster

    models = {model_id: tiny_models[model_id] for model_id in ("test/tiny-mean", "test/tiny-cls")}
    running = Cluster(tmp_path, etcd_server.endpoint, etcd_prefix, models, start_config)
    yield running
    running.stop()
