"""A cluster on loopback for tests and benchmarks: config service (on a given etcd), workers, gateways."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc

from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from sie_common.cluster.etcd import Etcd
from sie_stack.up import wait_for_leader
from worker_process import WorkerProcess, stop_all

T = TypeVar("T")


def model_config(model_id: str, weights: Path, adapter: str = "sentence_transformer", **fields: object) -> dict:
    """A model config mapping for AddModel."""
    return {"id": model_id, "path": str(weights), "profiles": {"default": {"adapter": adapter}}, **fields}


class Cluster:
    def __init__(
        self,
        tmp: Path,
        etcd_endpoint: str,
        prefix: str,
        models: list[dict],
        start_config: Callable[..., WorkerProcess],
        admin_token: str | None = None,
    ) -> None:
        """Start a config service with `start_config` and add `models` (model config mappings) through it."""
        self._tmp = tmp
        self.etcd_endpoint = etcd_endpoint
        self.prefix = prefix
        self.processes: list[WorkerProcess] = []
        self.config = start_config()
        with grpc.insecure_channel(self.config.address) as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            wait_for_leader(admin)
            credentials = (("authorization", f"Bearer {admin_token}"),) if admin_token else ()
            for config in models:
                admin.AddModel(config_pb2.AddModelRequest(config=config), metadata=credentials)
        self._empty_models_dir = tmp / "no-local-models"
        self._empty_models_dir.mkdir(exist_ok=True)

    def _env(self) -> dict[str, str]:
        return {"SIE_ETCD_ENDPOINTS": self.etcd_endpoint, "SIE_ETCD_PREFIX": self.prefix}

    def start_worker(self, name: str, *, wait: bool = True, **env: str) -> WorkerProcess:
        """A cluster-mode worker with id `name`; it serves only what the config service holds. Once it serves,
        unless `wait` is False (then call its wait_serving(): several started first start up together)."""
        defaults = {
            **self._env(),
            "SIE_WORKER_ID": name,
            "SIE_MODELS_DIR": str(self._empty_models_dir),
            "SIE_PRELOAD_MODELS": "",
            "SIE_HEALTH_PUBLISH_INTERVAL_MS": "200",
            "SIE_WORKER_LEASE_TTL_S": "3",
        }
        worker = WorkerProcess({**defaults, **env}, self._tmp / f"{name}.log")
        self.processes.append(worker)
        if wait:
            worker.wait_serving()
        return worker

    def start_gateway(self, port: int | None = None, *, wait: bool = True, **env: str) -> WorkerProcess:
        """A gateway on `port` (default: a free one), e.g. the port of one it replaces; once it serves, unless `wait`
        is False."""
        gateway = WorkerProcess(
            {**self._env(), **env}, self._tmp / f"gateway-{len(self.processes)}.log", module="sie_gateway", port=port
        )
        self.processes.append(gateway)
        if wait:
            gateway.wait_serving(timeout_s=60)
        return gateway

    def wait_serving(self) -> None:
        """Until every worker and gateway started so far serves: those started with `wait=False` start up together."""
        for process in self.processes:
            process.wait_serving()

    def stop(self) -> None:
        """Stop the workers and gateways together (each one's drain and grace overlap the others')."""
        stop_all(self.processes)


def wait_until(condition: Callable[[], bool], timeout_s: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def gateway_model(
    stub: inference_pb2_grpc.InferenceStub, model: str, metadata: tuple[tuple[str, str], ...] = ()
) -> inference_pb2.Model:
    return stub.GetModel(inference_pb2.GetModelRequest(model=model), metadata=metadata, timeout=10).model


def served_by(call_result: tuple) -> str:
    """The worker id from a `with_call` result's trailers."""
    _, call = call_result
    return dict(call.trailing_metadata())["x-sie-worker"]


def etcd_call(endpoint: str, prefix: str, use: Callable[[Etcd], Awaitable[T]]) -> T:
    """Run `use` with a fresh etcd client of `prefix` at `endpoint`, from synchronous test code."""

    async def run() -> T:
        etcd = Etcd([endpoint], prefix)
        await etcd.connect()
        try:
            return await use(etcd)
        finally:
            await etcd.close()

    return asyncio.run(run())
