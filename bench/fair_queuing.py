"""Small requests beside a bulk neighbour: a one-item request's p50 while a 4,096-item stream runs, against its idle p50.

    python bench/fair_queuing.py --before /path/to/other/checkout [--rounds 3] [--note "..."]

Two standalone workers run at once, each serving two tiny random models
(tools/tiny_models.py) A and B: "after" runs this checkout's worker; "before"
runs the worker of another checkout (`--before`: 9c3634b is the last commit
without fair queuing), through its own PYTHONPATH. Each round gives every
worker in turn, in a rotating order, one block of each phase, so both see the
same machine even while its load drifts:

- idle: one client sending one-item requests to B, one every 50 ms (open loop);
- bulk neighbour, other model: the same, while a second client keeps sending
  4,096-item requests to A, one after another;
- bulk neighbour, same model: one-item requests to A beside the 4,096-item stream on A.

Writes bench/results/<date>-<machine>-<cores>cores-fair-queuing.json and the
"Small requests beside a bulk neighbour" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
from report import replace_docs_section
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import build_tiny_model, write_model_yaml
from worker_process import WorkerProcess
from workloads import SINGLE_TEXT, bulk, percentile, summary

ROOT = Path(__file__).resolve().parents[1]

MODEL_A = "bench/tiny-bulk"
MODEL_B = "bench/tiny-small"
BULK_ITEMS = 4096
SMALL_REQUESTS = 100
SMALL_INTERVAL_S = 0.05
WARMUP = 20
PHASES = ("idle", "other_model", "same_model")
# The source directories of a checkout, in the order `make` and the tests put them on PYTHONPATH.
SOURCE_DIRS = ("contract/python", "lib", "services/worker", "services/gateway", "services/config", "clients/python", "deploy/local")


def small_latencies_ms(
    stub: inference_pb2_grpc.InferenceStub, model: str, requests: int, interval_s: float = SMALL_INTERVAL_S
) -> list[float]:
    """One-item requests sent at a fixed pace (open loop: one every `interval_s` whether or not the previous one
    was answered), so they sample every moment of the bulk stream alike, not mostly the moments it lets them pass."""
    request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=SINGLE_TEXT)])
    latencies: list[float] = []
    calls = []
    started = time.perf_counter()
    for number in range(requests):
        time.sleep(max(0.0, started + number * interval_s - time.perf_counter()))
        sent = time.perf_counter()
        call = stub.Encode.future(request, timeout=120)
        call.add_done_callback(lambda _, sent=sent: latencies.append((time.perf_counter() - sent) * 1000))
        calls.append(call)
    for call in calls:
        call.result()
    while len(latencies) < requests:  # the last callbacks run on grpc's thread
        time.sleep(0.001)
    return latencies


@contextmanager
def bulk_stream(address: str, model: str, texts: list[str]) -> Iterator[dict[str, float]]:
    """A client sending BULK_ITEMS-item requests to `model`, one after another, until the block ends (then the one
    in flight is awaited). Yields counters: requests answered and their mean seconds."""
    request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=text) for text in texts], debug=True)
    stop = threading.Event()
    counters = {"requests": 0.0, "seconds": 0.0, "forward_ms": 0.0}
    forward_ms: list[float] = []

    def run() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not stop.is_set():
                started = time.perf_counter()
                answer = stub.Encode(request, timeout=600)
                counters["requests"] += 1
                counters["seconds"] += time.perf_counter() - started
                forward_ms.extend(batch.inference_ms for batch in answer.timing.batches)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.5)  # the first bulk request is in the worker's queue
    try:
        yield counters
    finally:
        stop.set()
        thread.join()
    if counters["requests"]:
        counters["seconds"] /= counters["requests"]
        counters["forward_ms"] = statistics.median(forward_ms)


def measure(address: str, texts: list[str]) -> dict[str, dict[str, float]]:
    """One block of each phase on one worker."""
    measured: dict[str, dict[str, float]] = {}
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for phase in PHASES:
            if phase == "idle":
                latencies, counters = small_latencies_ms(stub, MODEL_B, SMALL_REQUESTS), {}
            else:
                with bulk_stream(address, MODEL_A, texts) as counters:
                    latencies = small_latencies_ms(stub, MODEL_B if phase == "other_model" else MODEL_A, SMALL_REQUESTS)
            measured[phase] = {
                "p50_ms": statistics.median(latencies),
                "p90_ms": percentile(latencies, 0.9),
                "bulk_requests": counters.get("requests", 0.0),
                "bulk_request_s": counters.get("seconds", 0.0),
                "bulk_forward_ms": counters.get("forward_ms", 0.0),  # median forward pass of the bulk's batches
            }
            # Against the idle p50 of the same block: a ratio holds better than either figure while the machine drifts.
            measured[phase]["ratio_to_idle"] = measured[phase]["p50_ms"] / measured["idle"]["p50_ms"]
    return measured


def cpu() -> dict[str, str]:
    """The CPU model and its SIMD flags, from /proc/cpuinfo."""
    model, flags = platform.processor() or platform.machine(), ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "model name" and model == (platform.processor() or platform.machine()):
            model = value.strip()
        elif name.strip() == "flags" and not flags:
            flags = " ".join(flag for flag in value.split() if re.match(r"(avx|sse|fma|amx|f16c)", flag))
    return {"model": model, "isa_flags": flags}


def machine(**extra: object) -> dict[str, object]:
    """What a result records of the machine it ran on: CPU model and ISA flags, cores, Python, torch and its threads."""
    import torch

    return {
        "cpu": cpu(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--before", required=True, help="checkout whose worker is the 'before', e.g. `git worktree add --detach DIR 9c3634b` (main without fair queuing)"
    )
    parser.add_argument("--note", default="", help="said under the table, e.g. that the machine was shared")
    args = parser.parse_args()
    texts = (bulk().texts * 3)[:BULK_ITEMS]
    checkouts = {"before": Path(args.before).resolve(), "after": ROOT}
    runs: dict[str, list[dict[str, dict[str, float]]]] = {name: [] for name in checkouts}
    with tempfile.TemporaryDirectory() as tmp:
        models_dir = Path(tmp) / "models"
        models_dir.mkdir()
        for model_id in (MODEL_A, MODEL_B):
            weights = build_tiny_model(models_dir / model_id.split("/")[1], pooling="mean", normalize=True, include_prompt=True)
            write_model_yaml(models_dir, model_id, weights)
        workers = {
            name: WorkerProcess(
                {
                    "SIE_PRELOAD_MODELS": f"{MODEL_A},{MODEL_B}",
                    "SIE_MODELS_DIR": str(models_dir),
                    "SIE_INSTRUMENTATION": "true",  # the bulk requests' forward passes, from their debug statistics
                    "PYTHONPATH": os.pathsep.join(str(checkout / path) for path in SOURCE_DIRS),
                },
                Path(tmp) / f"worker-{name}.log",
            )
            for name, checkout in checkouts.items()
        }
        try:
            for worker in workers.values():
                worker.wait_serving()
                with grpc.insecure_channel(worker.address) as channel:
                    small_latencies_ms(inference_pb2_grpc.InferenceStub(channel), MODEL_B, WARMUP)
            names = list(workers)
            for round_number in range(args.rounds):
                for name in names[round_number % 2 :] + names[: round_number % 2]:
                    runs[name].append(measure(workers[name].address, texts))
                    print(round_number, name, json.dumps(runs[name][-1]), flush=True)
        finally:
            for worker in workers.values():
                worker.stop()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": cpu(), "cores": os.cpu_count(), "python": platform.python_version()},
        "workload": {
            "small": f"1 client, {SMALL_REQUESTS} one-item requests, one every {SMALL_INTERVAL_S * 1000:.0f} ms (open loop; {SINGLE_TEXT!r})",
            "bulk": f"1 client, {BULK_ITEMS}-item requests of 10-30 words back to back, on model A",
            "models": "two tiny random BERT models (tools/tiny_models.py): A takes the bulk stream, B or A the one-item requests",
        },
        "note": args.note,
        "checkouts": {name: str(path) for name, path in checkouts.items()},
        "results": {
            name: {phase: {metric: summary([run[phase][metric] for run in measured]) for metric in measured[0][phase]} for phase in PHASES}
            for name, measured in runs.items()
        },
        "rounds": runs,
    }
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores-fair-queuing.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["results"], indent=2))
    write_section(result, out.name)


def write_section(result: dict, file_name: str) -> None:
    """Replace (or append) the "Small requests beside a bulk neighbour" section of docs/benchmarks.md."""
    rows = []
    for name, phases in result["results"].items():
        idle, other, same = (phases[phase]["p50_ms"]["median"] for phase in PHASES)
        other_ratio, same_ratio = (phases[phase]["ratio_to_idle"] for phase in PHASES[1:])
        rows.append(
            f"| {name} | {idle:.1f} | {other:.1f} | {other_ratio['median']:.1f}x ({other_ratio['min']:.1f}-{other_ratio['max']:.1f}) "
            f"| {same:.1f} | {same_ratio['median']:.1f}x ({same_ratio['min']:.1f}-{same_ratio['max']:.1f}) |"
        )
    bulk_s = {name: phases["other_model"]["bulk_request_s"]["median"] for name, phases in result["results"].items()}
    forward = {
        name: (phases["other_model"]["bulk_forward_ms"]["median"], phases["same_model"]["bulk_forward_ms"]["median"])
        for name, phases in result["results"].items()
    }
    section = (
        "## Small requests beside a bulk neighbour\n\n"
        f"Produced by `python bench/fair_queuing.py` (raw figures: `bench/results/{file_name}`), {result['date']}, "
        f"{result['machine']['cores']} cores, {result['machine']['cpu']['model']} ({result['machine']['cpu']['isa_flags']}). "
        "Two workers run side by side: before (without fair queuing) and after; each round gives each in turn one block "
        f"of each phase, medians of {len(result['rounds']['after'])} rounds. Small: {result['workload']['small']}. "
        f"Bulk: {result['workload']['bulk']}. Models: {result['workload']['models']}.\n\n"
        "| worker | idle p50 (ms) | p50 beside a 4,096-item stream on another model (ms) | ratio to idle (min-max) "
        "| p50 beside it on the same model (ms) | ratio to idle (min-max) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n\n"
        "Ratios are taken block by block (a phase's p50 over the same block's idle p50), then their median; "
        "the target is 3x or less.\n\n"
        "A 4,096-item request took "
        + ", ".join(f"{seconds:.2f} s ({name})" for name, seconds in bulk_s.items())
        + " beside the one-item client; one of its forward passes (64 items) took "
        + ", ".join(f"{other:.1f} / {same:.1f} ms ({name})" for name, (other, same) in forward.items())
        + " (median; beside the other-model / same-model client). A one-item request beside it waits at least for the pass"
        " running when it arrives: no fairness goes below that.\n"
        + (f"\n{result['note']}\n" if result["note"] else "")
    )
    replace_docs_section(ROOT / "docs" / "benchmarks.md", "Small requests beside a bulk neighbour", section)


if __name__ == "__main__":
    main()
