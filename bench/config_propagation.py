"""Config propagation with thousands of models: how long a new model takes to reach the gateway, and the gateway's p50 meanwhile.

    python bench/config_propagation.py [--models 2500]

Starts etcd, a config service and a gateway on loopback, writes `--models`
model configs straight into etcd one transaction each (as many separate
AddModels would: one watch event apiece), then at once adds one more through
the config service and measures how long until the gateway serves GetModel
for it, while one client calls GetModel on a known model back to back (its
p50, over the propagation and at least PROBE_MIN_S, is the gateway's latency
meanwhile). Prints one JSON object;
docs/benchmarks.md ("Config propagation") records runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import grpc
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from sie_common.cluster import config_store
from sie_common.cluster.etcd import Etcd
from sie_common.cluster.model_config import parse_model_config
from sie_stack.processes import EtcdProcess
from sie_stack.up import wait_for_leader
from tiny_models import build_tiny_model
from worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[1]

PREFIX = "/sie-bench/"
# Give up on a gateway that has not seen the new model by then.
PROPAGATION_LIMIT_S = 300
# The latency probe runs at least this long, however fast the new model arrives.
PROBE_MIN_S = 2.0


def config(model_id: str, weights: Path) -> dict:
    return {"id": model_id, "path": str(weights), "profiles": {"default": {"adapter": "sentence_transformer"}}}


async def write_one_by_one(endpoint: str, weights: Path, count: int) -> None:
    etcd = Etcd([endpoint], PREFIX)
    await etcd.connect()
    try:
        for index in range(count):
            model_id = f"bulk/model-{index:05d}"
            await etcd.put(config_store.model_name(model_id), config_store.encode_model(parse_model_config(config(model_id, weights), source="bench")))
    finally:
        await etcd.close()


def known(stub: inference_pb2_grpc.InferenceStub, model: str) -> bool:
    try:
        return stub.GetModel(inference_pb2.GetModelRequest(model=model), timeout=30).model.id == model
    except grpc.RpcError as error:
        # Before the MODEL_NOT_FOUND message was bounded, one listing thousands of models overflowed the metadata limit.
        if error.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.RESOURCE_EXHAUSTED):
            raise
        return False


def run(models: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        weights = build_tiny_model(tmp / "tiny", pooling="mean", normalize=True, include_prompt=True)
        etcd = EtcdProcess(tmp / "etcd", tmp / "etcd.log")
        etcd.start()
        env = {"SIE_ETCD_ENDPOINTS": etcd.endpoint, "SIE_ETCD_PREFIX": PREFIX, "SIE_WEIGHT_ROOTS": str(tmp)}
        # A loopback-only stack: admin writes without a token.
        config_service = WorkerProcess({**env, "SIE_ALLOW_UNAUTHENTICATED_ADMIN": "true"}, tmp / "config.log", module="sie_config")
        gateway = None
        try:
            config_service.wait_serving(timeout_s=60)
            with config_service.channel() as channel:
                admin = config_pb2_grpc.ConfigServiceStub(channel)
                wait_for_leader(admin)
                admin.AddModel(config_pb2.AddModelRequest(config=config("known/model", weights)), timeout=30)
                gateway = WorkerProcess(env, tmp / "gateway.log", module="sie_gateway")
                gateway.wait_serving(timeout_s=60)
                started = time.monotonic()
                asyncio.run(write_one_by_one(etcd.endpoint, weights, models))
                written_s = time.monotonic() - started
                with gateway.channel() as gateway_channel:
                    stub = inference_pb2_grpc.InferenceStub(gateway_channel)
                    latencies: list[float] = []
                    done = threading.Event()

                    def probe() -> None:
                        while not done.is_set():
                            begun = time.perf_counter()
                            stub.GetModel(inference_pb2.GetModelRequest(model="known/model"), timeout=60)
                            latencies.append(time.perf_counter() - begun)

                    prober = threading.Thread(target=probe)
                    prober.start()
                    added = time.monotonic()
                    admin.AddModel(config_pb2.AddModelRequest(config=config("late/model", weights)), timeout=60)
                    while not known(stub, "late/model") and time.monotonic() - added < PROPAGATION_LIMIT_S:
                        time.sleep(0.05)
                    propagation_s = time.monotonic() - added
                    time.sleep(max(0.0, PROBE_MIN_S - propagation_s))
                    done.set()
                    prober.join()
            return {
                "models": models,
                "write_s": round(written_s, 1),
                "new_model_reached_gateway_s": round(propagation_s, 2),
                "gateway_getmodel_p50_ms": round(statistics.median(latencies) * 1000, 1) if latencies else None,
                "probes": len(latencies),
            }
        finally:
            for process in (gateway, config_service):
                if process is not None:
                    process.stop()
            etcd.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=2500)
    print(json.dumps(run(parser.parse_args().models)))


if __name__ == "__main__":
    main()
