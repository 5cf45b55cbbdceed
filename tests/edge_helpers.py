"""The HTTP/JSON edge the tests run: a config service, one worker with a tiny model of each operation, a gateway and
Envoy in front (conftest.py shares one as `edge`, and one whose gateway wants a token as `auth_edge`), and curl."""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
from local_cluster import Cluster, gateway_model, model_config, wait_until
from sie.v1 import inference_pb2_grpc
from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess
from worker_process import WorkerProcess, free_port

MEAN = "test/tiny-mean"
RERANKER = "test/tiny-reranker"
NER = "test/tiny-ner"
CLIP = "test/tiny-clip"
SPLADE = "test/tiny-splade"
ADMIN_TOKEN = "admin-s3cret"
# The inference token of `auth_edge`'s gateway.
AUTH_TOKEN = "edge-inference-tok-41c9"


class Edge:
    def __init__(self, cluster: Cluster, gateway: WorkerProcess, envoy: EnvoyProcess, port: int) -> None:
        self.cluster = cluster
        self.gateway = gateway
        self.envoy = envoy
        self.base = f"http://127.0.0.1:{port}"
        self.address = f"127.0.0.1:{port}"


@contextlib.contextmanager
def running_edge(tmp: Path, etcd_endpoint: str, tiny_models: dict[str, Path], **gateway_env: str) -> Iterator[Edge]:
    """Config service (admin token), one worker with the tiny models, a gateway (`gateway_env`) and Envoy in front."""
    prefix = f"/sie-edge-{uuid.uuid4().hex[:8]}/"
    env = {"SIE_ETCD_ENDPOINTS": etcd_endpoint, "SIE_ETCD_PREFIX": prefix, "SIE_ADMIN_TOKEN": ADMIN_TOKEN}

    def start_config() -> WorkerProcess:
        config = WorkerProcess(env, tmp / "config.log", module="sie_config")
        config.wait_serving(timeout_s=60)
        return config

    models = [
        model_config(MEAN, tiny_models[MEAN]),
        model_config(RERANKER, tiny_models[RERANKER], adapter="cross_encoder", tasks=["score"]),
        model_config(NER, tiny_models[NER], adapter="token_classifier", tasks=["extract"]),
        model_config(CLIP, tiny_models[CLIP], adapter="clip", tasks=["encode", "score"], inputs=["text", "image"]),
        model_config(SPLADE, tiny_models[SPLADE], adapter="splade", output_types=["sparse"]),
    ]
    cluster = Cluster(tmp, etcd_endpoint, prefix, models, start_config, admin_token=ADMIN_TOKEN)
    envoy = None
    try:
        # The worker (its preloads), the gateway and Envoy start up together.
        worker = cluster.start_worker("edge-worker", wait=False, SIE_PRELOAD_MODELS=",".join([MEAN, RERANKER, NER, CLIP, SPLADE]))
        adapter_port = free_port()  # the gateway's HTTP adapter (the foreign wires), behind Envoy
        gateway = cluster.start_gateway(wait=False, SIE_GATEWAY_CONFIGURED_GPUS="l4", SIE_GATEWAY_HTTP_PORT=str(adapter_port), **gateway_env)
        port, admin_port = free_port(), free_port()
        config_path = tmp / "envoy.json"
        config_path.write_text(json.dumps(render(listen_port=port, admin_port=admin_port, gateway=gateway.address, config=cluster.config.address, adapter=f"127.0.0.1:{adapter_port}")))
        envoy = EnvoyProcess(config_path, tmp / "envoy.log", admin_port)
        gateway.wait_serving(timeout_s=60)
        envoy.wait_ready()
        worker.wait_serving()
        token = gateway_env.get("SIE_AUTH_TOKENS", "").split(",")[0]
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            wait_until(lambda: "edge-worker" in gateway_model(stub, NER, metadata).loaded_on, what="worker registered")
        yield Edge(cluster, gateway, envoy, port)
    finally:
        if envoy is not None:
            envoy.stop()
        cluster.stop()
        cluster.config.stop()


def curl(edge: Edge, method: str, path: str, body: object | None = None, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    command = ["curl", "-s", "-X", method, "-w", "\n%{http_code}", edge.base + path]
    for key, value in (headers or {}).items():
        command += ["-H", f"{key}: {value}"]
    if body is not None:
        command += ["-H", "content-type: application/json", "-d", body if isinstance(body, str) else json.dumps(body)]
    output = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout
    text, _, status = output.rpartition("\n")
    try:
        return int(status), (json.loads(text) if text.strip() else {})
    except json.JSONDecodeError:  # Envoy's own refusals (e.g. JSON that does not fit the message) are plain text
        return int(status), {"text": text}
