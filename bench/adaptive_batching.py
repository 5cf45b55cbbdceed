"""Adaptive batching against fixed batch waits: light-load latency and heavy-load throughput, side by side.

    python bench/adaptive_batching.py [--rounds 4]

One standalone worker per setting (adaptive with its defaults; fixed waits of
1, 5 and 10 ms through SIE_ADAPTIVE_BATCHING=false), all running at once.
Each round gives every worker in turn one block of each phase, so all
settings see the same machine, even a shared one whose load drifts:

- light load: one client sending one-item requests back to back; p50 latency;
- heavy load, small requests: 32 clients sending one-item requests; items/s;
- heavy load, bulk: the harness's bulk workload (bench/workloads.py) on
  all-MiniLM-L6-v2 (100 texts a request, 4 clients; its first BULK_TEXTS sentences); items/s.

The light and small phases use the tiny random model of tools/tiny_models.py:
its forward pass takes about as long as the batch wait, as a real model's
does on a GPU, so the wait is what decides latency there.

Writes bench/results/<date>-<machine>-adaptive.json and the "Adaptive batching"
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import grpc
from ours import TINY, grpc_sender
from report import replace_docs_section
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import build_tiny_model, write_model_yaml
from worker_process import WorkerProcess
from workloads import MODEL, Workload, bulk, summary, throughput

ROOT = Path(__file__).resolve().parents[1]

SETTINGS: dict[str, dict[str, str]] = {
    "adaptive (defaults)": {},
    "fixed 1 ms": {"SIE_ADAPTIVE_BATCHING": "false", "SIE_MAX_BATCH_WAIT_MS": "1"},
    "fixed 5 ms": {"SIE_ADAPTIVE_BATCHING": "false", "SIE_MAX_BATCH_WAIT_MS": "5"},
    "fixed 10 ms": {"SIE_ADAPTIVE_BATCHING": "false", "SIE_MAX_BATCH_WAIT_MS": "10"},
}
# Per block.
LIGHT_REQUESTS = 60
SMALL_CLIENTS = 32
SMALL_REQUESTS = 640
BULK_TEXTS = 400


def light_p50_ms(stub: inference_pb2_grpc.InferenceStub, texts: list[str]) -> float:
    """One client, one item a request, back to back."""
    latencies = []
    for text in texts[:LIGHT_REQUESTS]:
        started = time.perf_counter()
        stub.Encode(inference_pb2.EncodeRequest(model=TINY, items=[types_pb2.Item(text=text)]), timeout=60)
        latencies.append((time.perf_counter() - started) * 1000)
    return statistics.median(latencies)


def small_requests_items_per_s(address: str, texts: list[str]) -> float:
    """SMALL_CLIENTS clients, each with its own channel, one item a request."""
    channels = [grpc.insecure_channel(address) for _ in range(SMALL_CLIENTS)]
    stubs = [inference_pb2_grpc.InferenceStub(channel) for channel in channels]

    def client(number: int) -> int:
        stub = stubs[number]
        sent = 0
        for text in texts[number : SMALL_REQUESTS : SMALL_CLIENTS]:
            stub.Encode(inference_pb2.EncodeRequest(model=TINY, items=[types_pb2.Item(text=text)]), timeout=60)
            sent += 1
        return sent

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(SMALL_CLIENTS) as pool:
        done = sum(pool.map(client, range(SMALL_CLIENTS)))
    for channel in channels:
        channel.close()
    return done / (time.perf_counter() - started)


def measure(address: str, texts: list[str]) -> dict[str, float]:
    """One block of each phase."""
    with grpc.insecure_channel(address) as channel:
        light = light_p50_ms(inference_pb2_grpc.InferenceStub(channel), texts)
    small = small_requests_items_per_s(address, texts)
    bulk_rate = throughput(grpc_sender(address, MODEL), Workload("bulk", texts[:BULK_TEXTS], 100, ""))
    return {"light_p50_ms": light, "small_items_per_s": small, "bulk_items_per_s": bulk_rate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--note", default="", help="said under the table, e.g. that the machine was shared")
    args = parser.parse_args()
    texts = bulk().texts
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(tmp) / "models"
        models_dir.mkdir()
        write_model_yaml(models_dir, TINY, build_tiny_model(models_dir / "tiny", pooling="mean", normalize=True, include_prompt=True))
        workers = {
            name: WorkerProcess(
                {"SIE_PRELOAD_MODELS": f"{TINY},{MODEL}", "SIE_MODELS_DIR": str(models_dir), **env}, Path(tmp) / f"worker-{index}.log"
            )
            for index, (name, env) in enumerate(SETTINGS.items())
        }
        try:
            for worker in workers.values():
                worker.wait_serving()
                with grpc.insecure_channel(worker.address) as channel:
                    light_p50_ms(inference_pb2_grpc.InferenceStub(channel), texts[:20])  # warm-up
            for round_number in range(args.rounds):
                for name, worker in workers.items():
                    runs[name].append(measure(worker.address, texts))
                    print(round_number, name, runs[name][-1], flush=True)
        finally:
            for worker in workers.values():
                worker.stop()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "light": f"1 client, {LIGHT_REQUESTS} one-item requests back to back, tiny model",
            "small": f"{SMALL_CLIENTS} clients, {SMALL_REQUESTS} one-item requests, tiny model",
            "bulk": f"{BULK_TEXTS} sentences of 10-30 words, 100 a request, 4 clients, {MODEL}",
        },
        "note": args.note,
        "settings": {
            name: {metric: summary([run[metric] for run in measured]) for metric in measured[0]} for name, measured in runs.items()
        },
    }
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores-adaptive.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    write_section(result, out.name)


def write_section(result: dict, file_name: str) -> None:
    """Replace (or append) the "Adaptive batching" section of docs/benchmarks.md."""
    rows = "\n".join(
        f"| {name} | {s['light_p50_ms']['median']:.1f} | {s['small_items_per_s']['median']:.0f} | {s['bulk_items_per_s']['median']:.0f} |"
        for name, s in result["settings"].items()
    )
    section = (
        "## Adaptive batching\n\n"
        f"Produced by `python bench/adaptive_batching.py` (raw figures: `bench/results/{file_name}`), {result['date']}, "
        f"{result['machine']['cores']} cores; one standalone worker per setting, medians of "
        f"{result['settings'][next(iter(result['settings']))]['light_p50_ms']['runs']} rounds, each giving every worker in turn one block "
        "of each phase. "
        f"Light: {result['workload']['light']}. Small: {result['workload']['small']}. Bulk: {result['workload']['bulk']}.\n\n"
        "| batching | light-load p50 (ms) | heavy load, one-item requests: items/s | heavy load, bulk: items/s |\n"
        "| --- | ---: | ---: | ---: |\n"
        f"{rows}\n"
        + (f"\n{result['note']}\n" if result["note"] else "")
    )
    replace_docs_section(ROOT / "docs" / "benchmarks.md", "Adaptive batching", section)


if __name__ == "__main__":
    main()
