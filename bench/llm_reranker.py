"""The LLM reranker replica through a standalone worker (Score) against sentence-transformers' CrossEncoder.predict
in this process, on the same machine in the same run, with the same pairs.

    python bench/llm_reranker.py [--rounds 3] [--note "..."]

The model is the tiny random Qwen3-Reranker replica of tests/test_llm_reranker.py (tools/tiny_rerankers.py: a
2-layer Qwen3 causal LM, hidden 32, a trained ChatML BPE tokenizer, saved by sentence-transformers as a
CrossEncoder with LogitScore on yes / no), maximum length 256. Pairs: one query against 512 documents of 10-30
words (the first of bench/workloads.bulk's sentences). Each round measures, in turn:

- bulk: all pairs; in-process as one predict() call at its best batch size (32, 64, 128 tried once before
  the rounds), the worker as Score requests of 64 documents from 4 client threads (bench/workloads.throughput);
- single pair: 50 one-document requests to each path, taking turns (bench/workloads.alternating_latencies_ms).

The worker's scores are checked against predict()'s first; after the rounds, both paths are set against the roofline
of the replica's own Linear shapes, with what the pairs would cost a real Qwen3-Reranker-0.6B here (bench/roofline.py
`served`). Writes bench/results/<date>-<arch>-<machine kind>-<cores>cores-llm-reranker.json and the "LLM reranker"
section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import numpy as np
import roofline
from machine import describe, slug, this_cpu
from report import replace_docs_section
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import write_config
from tiny_rerankers import build_tiny_qwen3_reranker
from worker_process import WorkerProcess
from workloads import (
    Send,
    Workload,
    alternating_latencies_ms,
    bulk,
    percentile,
    summary,
    throughput,
)

ROOT = Path(__file__).resolve().parents[1]

MODEL = "bench/tiny-qwen3-reranker"
QUERY = "how do plants turn sunlight into chemical energy"
MAX_LENGTH = 256
PAIRS = 512
PER_REQUEST = 64
SINGLE_REQUESTS = 50
BATCH_SIZES = (32, 64, 128)


def score_sender(address: str) -> Send:
    """Score RPCs of the query against the given documents, one channel per client thread."""
    local = threading.local()

    def send(texts: Sequence[str]) -> int:
        stub = getattr(local, "stub", None)
        if stub is None:
            stub = local.stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(address))
        request = inference_pb2.ScoreRequest(model=MODEL, query=types_pb2.Item(text=QUERY), items=[types_pb2.Item(text=text) for text in texts])
        return len(stub.Score(request, timeout=600).scores)

    return send


def served_scores(address: str, texts: list[str]) -> np.ndarray:
    with grpc.insecure_channel(address) as channel:
        request = inference_pb2.ScoreRequest(model=MODEL, query=types_pb2.Item(text=QUERY), items=[types_pb2.Item(text=text) for text in texts])
        response = inference_pb2_grpc.InferenceStub(channel).Score(request, timeout=600)
    scores = np.zeros(len(texts), dtype=np.float32)
    for entry in response.scores:
        scores[entry.index] = entry.score
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--note", default="", help="said under the table, e.g. that the machine was shared")
    args = parser.parse_args()
    from sentence_transformers import CrossEncoder

    texts = bulk().texts[:PAIRS]
    workload = Workload("pairs", texts, PER_REQUEST, f"one query against {PAIRS:,} documents of 10-30 words, {PER_REQUEST} a request")
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        weights = build_tiny_qwen3_reranker(tmp / "replica", max_length=MAX_LENGTH)
        configs = tmp / "configs"
        configs.mkdir()
        write_config(configs, MODEL, f"path: {weights}\ntasks: [score]\nprofiles:\n  default:\n    adapter: llm_reranker\n")
        reference = CrossEncoder(str(weights), device="cpu")
        pairs = [(QUERY, text) for text in texts]

        def predict_rate(batch_size: int) -> float:
            begun = time.perf_counter()
            reference.predict(pairs, batch_size=batch_size)
            return PAIRS / (time.perf_counter() - begun)

        def in_process(batch: Sequence[str]) -> int:
            return len(reference.predict([(QUERY, text) for text in batch]))

        env = {"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": MODEL, "SIE_WEIGHT_ROOTS": str(tmp)}
        worker = WorkerProcess(env, tmp / "worker.log")
        try:
            worker.wait_serving()
            expected = reference.predict(pairs, batch_size=32)
            difference = float(np.abs(served_scores(worker.address, texts) - expected).max())
            send = score_sender(worker.address)
            reference.predict(pairs[:128], batch_size=32)  # warm-up
            rates = {size: predict_rate(size) for size in BATCH_SIZES}
            best = max(rates, key=rates.__getitem__)
            runs: dict[str, dict[str, list[float]]] = {path: {"bulk": [], "p50": [], "p99": []} for path in ("in_process", "worker")}
            for _ in range(args.rounds):
                runs["in_process"]["bulk"].append(predict_rate(best))
                runs["worker"]["bulk"].append(throughput(send, workload))
                for path, latencies in zip(("in_process", "worker"), alternating_latencies_ms([in_process, send], SINGLE_REQUESTS, texts[0])):
                    runs[path]["p50"].append(percentile(latencies, 0.5))
                    runs[path]["p99"].append(percentile(latencies, 0.99))
            median = {path: statistics.median(runs[path]["bulk"]) for path in runs}
            lengths = reference.preprocess(pairs)["attention_mask"].sum(dim=1).tolist()
            base = reference.model.model  # the decoder under the causal LM's head (read at the last token only)
            width = base.config.num_attention_heads * base.config.head_dim
            figures = roofline.served(base, lengths, base.config.num_hidden_layers, width, median, this_cpu())
        finally:
            worker.stop()

    result = {
        "date": datetime.date.today().isoformat(),
        "machine": describe("cpu"),
        "model": "tiny random Qwen3-Reranker replica (tools/tiny_rerankers.py: 2 layers, hidden 32, ChatML BPE), max length 256",
        "workload": {"bulk": workload.description, "single": f"{SINGLE_REQUESTS} one-document requests per path per round, taking turns"},
        "rounds": args.rounds,
        "in_process_batch_size": best,
        "in_process_batch_sizes_tried": rates,
        "max_abs_score_difference": difference,
        "paths": {path: {metric: {**summary(values), "values": values} for metric, values in metrics.items()} for path, metrics in runs.items()},
        "roofline": figures,
        "seconds": round(time.monotonic() - started, 1),
        "note": args.note,
    }
    stem = f"{result['date']}-{platform.machine()}-{slug(result['machine']['kind'])}-{os.cpu_count()}cores-llm-reranker"
    results_file = ROOT / "bench" / "results" / f"{stem}.json"
    results_file.write_text(json.dumps(result, indent=2) + "\n")
    replace_docs_section(ROOT / "docs" / "benchmarks.md", "LLM reranker", section(result, results_file))
    print(section(result, results_file))


def section(result: dict, results_file: Path) -> str:
    machine = result["machine"]
    paths = result["paths"]

    def cell(path: str, metric: str, digits: int) -> str:
        figures = paths[path][metric]
        return f"{figures['median']:.{digits}f} ({figures['min']:.{digits}f}-{figures['max']:.{digits}f})"

    ratio = statistics.median(worker / ceiling for worker, ceiling in zip(_values(result, "worker", "bulk"), _values(result, "in_process", "bulk")))
    rows = [
        f"| in-process `CrossEncoder.predict` (batch {result['in_process_batch_size']}) | {cell('in_process', 'bulk', 0)} | "
        f"{cell('in_process', 'p50', 2)} | {cell('in_process', 'p99', 2)} |",
        f"| sie-worker standalone (gRPC `Score`, {PER_REQUEST} documents a request, 4 clients) | {cell('worker', 'bulk', 0)} | "
        f"{cell('worker', 'p50', 2)} | {cell('worker', 'p99', 2)} |",
    ]
    return "\n".join(
        [
            "## LLM reranker",
            "",
            f"Produced by `python bench/llm_reranker.py` (raw figures: `{results_file.relative_to(ROOT)}`), {result['date']}, "
            f"{machine['cores']} cores, {machine['cpu']} ({machine['kind']}; {', '.join(machine['isa'])}); torch {machine['torch']} "
            f"({machine['torch_threads']} threads). "
            f"Model: {result['model']}, served by adapter `llm_reranker`. Bulk: {result['workload']['bulk']}. Single: "
            f"{result['workload']['single']}. Medians of {result['rounds']} rounds (min-max).",
            "",
            "| path | bulk pairs/s | single-pair p50 ms | single-pair p99 ms |",
            "| --- | ---: | ---: | ---: |",
            *rows,
            "",
            f"Worker / in-process bulk: {ratio:.2f}x (per round, median). The worker's scores differ from predict()'s by at most "
            f"{result['max_abs_score_difference']:.1e}. In-process batch sizes tried (pairs/s): "
            + ", ".join(f"{size}: {rate:.0f}" for size, rate in result["in_process_batch_sizes_tried"].items())
            + ".",
            "",
            *roofline.served_lines(result["roofline"], {"in_process": "in-process", "worker": "the worker"}, "pairs"),
            *(["", result["note"]] if result["note"] else []),
            "",
        ]
    )


def _values(result: dict, path: str, metric: str) -> list[float]:
    return result["paths"][path][metric]["values"]


if __name__ == "__main__":
    main()
