"""The machine's limit for a model: the matmul rate its own Linear shapes attain here, and the FLOPs a workload costs.

A path's effective rate (workload FLOPs / seconds) over the fp32 rate says how
much of the machine it uses; the bf16 and int8 rates say what reduced
precision could reach on this CPU. The formula is in docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from machine import Cpu

from sie_worker.kernels.onednn import onednn_available

REPEATS = 20
# Tokens in one measured matmul: the worker's default batch (64 requests' items) of the workload's mean length.
BATCH_ITEMS = 64


# Heads that run on one token per sequence, not on every token: a BERT pooler, a causal LM's output head (an LLM
# reranker reads it at the last token only), a classification head.
PER_SEQUENCE = frozenset({"pooler", "lm_head", "score", "classifier"})

# Qwen3-0.6B's Linear layers (Qwen3-Embedding-0.6B and Qwen3-Reranker-0.6B: 28 layers, hidden 1024, 16 query heads
# and 8 key-value heads of 128, MLP 3072), per layer q, k, v, o, gate, up and down: what a real-size decoder does.
QWEN3_0_6B: dict[str, Any] = {
    "model": "Qwen3-0.6B layout (Qwen3-Embedding-0.6B, Qwen3-Reranker-0.6B)",
    "layers": 28,
    "attention_width": 16 * 128,
    "shapes": {(1024, 2048): 28, (1024, 1024): 56, (2048, 1024): 28, (1024, 3072): 56, (3072, 1024): 28},
}


def linear_shapes(model: torch.nn.Module) -> dict[tuple[int, int], int]:
    """(in_features, out_features) of every nn.Linear that runs on every token, with how many there are.

    The heads in PER_SEQUENCE run once per text, not per token, and are left out."""
    shapes: collections.Counter[tuple[int, int]] = collections.Counter()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not PER_SEQUENCE & set(name.split(".")):
            shapes[(module.in_features, module.out_features)] += 1
    return dict(shapes)


def attention_span(lengths: Sequence[int]) -> float:
    """The mean number of keys a token attends to: sum(L^2) / sum(L) over the sequences' real lengths
    (a token of a sequence of L tokens attends to L), so that per-token FLOPs times tokens is exact."""
    return sum(length * length for length in lengths) / sum(lengths)


def flops_per_token(shapes: dict[tuple[int, int], int], layers: int, hidden: int, span: float) -> float:
    """2*in*out per Linear (a multiply and an add per weight), plus attention's two matmuls (Q.K^T and
    softmax.V: 2 FLOPs * span * hidden each) in each layer; `hidden` is the attention's width (query heads times
    head size, which is the hidden size in BERT)."""
    linear = sum(2 * inputs * outputs * count for (inputs, outputs), count in shapes.items())
    return linear + layers * 2 * 2 * span * hidden


def workload_flops(model: torch.nn.Module, lengths: Sequence[int], layers: int, hidden: int) -> dict[str, Any]:
    """The workload's real tokens (no padding) and FLOPs, given each text's token count (`hidden`: the attention's
    width)."""
    span = attention_span(lengths)
    per_token = flops_per_token(linear_shapes(model), layers, hidden, span)
    tokens = sum(lengths)
    return {
        "tokens": tokens,
        "texts": len(lengths),
        "mean_tokens": tokens / len(lengths),
        "attention_span": span,
        "flops_per_token": per_token,
        "flops": per_token * tokens,
    }


def _best_seconds(call: Callable[[], object], repeats: int) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _kernels(rows: int, inputs: int, outputs: int, cpu: Cpu) -> dict[str, Callable[[], object] | str]:
    """One matmul of the shape per precision, or why that precision is not measured on this CPU."""
    x, w = torch.randn(rows, inputs), torch.randn(outputs, inputs)
    kernels: dict[str, Callable[[], object] | str] = {"fp32-mkl": lambda: F.linear(x, w)}
    if onednn_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(w)
        kernels["fp32-onednn"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    else:
        kernels["fp32-onednn"] = "unavailable in this PyTorch build"
    if cpu.bf16:
        xb, wb = x.bfloat16(), w.bfloat16()
        kernels["bf16"] = lambda: F.linear(xb, wb)
    else:
        kernels["bf16"] = "unsupported (no avx512_bf16 or amx_bf16)"
    if cpu.vnni:
        xq = torch.randint(-128, 128, (rows, inputs), dtype=torch.int8)
        wq = torch.randint(-128, 128, (inputs, outputs), dtype=torch.int8)
        kernels["int8"] = lambda: torch._int_mm(xq, wq)
        dynamic = torch.ao.nn.quantized.dynamic.Linear(inputs, outputs)
        kernels["int8-dynamic"] = lambda: dynamic(x)
    else:
        kernels["int8"] = kernels["int8-dynamic"] = "unsupported (no avx512_vnni, avx_vnni or amx_int8)"
    return kernels


KERNELS = {
    "fp32": "float32: per shape, the faster of the two kernels below (the rate a float32 matmul attains here)",
    "fp32-mkl": "torch.nn.functional.linear, float32 (PyTorch's own CPU Linear: MKL's sgemm on the plain weight)",
    "fp32-onednn": "torch.ops.mkldnn._linear_pointwise on a weight packed once for oneDNN (what the worker runs)",
    "bf16": "torch.nn.functional.linear, bfloat16 inputs and weights",
    "int8": "torch._int_mm, int8 x int8 -> int32 (the matmul alone)",
    "int8-dynamic": "torch.ao.nn.quantized.dynamic.Linear (quantizes each input, int8 matmul, float32 out)",
}


def measure(shapes: dict[tuple[int, int], int], rows: int, cpu: Cpu, repeats: int = REPEATS) -> dict[str, Any]:
    """GFLOP/s per precision for `rows` tokens through each shape (best of `repeats`, this process's torch threads),
    and for the model's whole mix of shapes (`_overall`)."""
    per_shape: dict[str, dict[str, float | str]] = {}
    with torch.inference_mode():
        for inputs, outputs in shapes:
            figures: dict[str, float | str] = {}
            for precision, kernel in _kernels(rows, inputs, outputs, cpu).items():
                best = (
                    kernel
                    if isinstance(kernel, str)
                    else 2 * rows * inputs * outputs / _best_seconds(kernel, repeats) / 1e9
                )
                figures[precision] = best
            per_shape[_name(rows, inputs, outputs)] = {"fp32": _fastest(figures, FP32_KERNELS), **figures}
    measured = {
        "rows": rows,
        "shapes": [[inputs, outputs, count] for (inputs, outputs), count in shapes.items()],
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "kernels": KERNELS,
        "per_shape_gflops": per_shape,
    }
    return {**measured, "gflops": _overall(measured)}


FP32_KERNELS = ("fp32-mkl", "fp32-onednn")


def _fastest(figures: dict[str, float | str], kernels: Sequence[str]) -> float | str:
    rates = [rate for kernel in kernels if isinstance(rate := figures[kernel], float)]
    return max(rates) if rates else str(figures[kernels[0]])


def best_of(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two measurements of the same shapes (before and after a run's paths) as one: each shape's faster rate.

    On a machine that others share, the attainable rate is the best one seen."""
    per_shape = {
        shape: {
            precision: max(rate, second["per_shape_gflops"][shape][precision]) if isinstance(rate, float) else rate
            for precision, rate in figures.items()
        }
        for shape, figures in first["per_shape_gflops"].items()
    }
    merged = {**first, "per_shape_gflops": per_shape, "measurements": 2}
    return {**merged, "gflops": _overall(merged)}


def _name(rows: int, inputs: int, outputs: int) -> str:
    return f"[{rows}, {inputs}] x [{inputs}, {outputs}]"


def _overall(measured: dict[str, Any]) -> dict[str, float | str]:
    """Per precision, the model's Linear FLOPs over the time its shapes take at their measured rates."""
    rows, per_shape = measured["rows"], measured["per_shape_gflops"]
    precisions = next(iter(per_shape.values())).keys()
    overall: dict[str, float | str] = {}
    for precision in precisions:
        flops = seconds = 0.0
        for inputs, outputs, count in measured["shapes"]:
            rate = per_shape[_name(rows, inputs, outputs)][precision]
            if isinstance(rate, str):
                overall[precision] = rate
                break
            shape_flops = 2 * rows * inputs * outputs * count
            flops += shape_flops
            seconds += shape_flops / (rate * 1e9)
        else:
            overall[precision] = flops / seconds / 1e9
    return overall


def served(
    model: torch.nn.Module, lengths: Sequence[int], layers: int, width: int, rates: dict[str, float], cpu: Cpu
) -> dict[str, Any]:
    """A model family's paths against the roofline of its own Linear shapes: the workload's FLOPs (texts of
    `lengths` tokens), each path's effective GFLOP/s from its items/s (`rates`), its fraction of the fp32 rate, and
    what the same texts would cost on a real-size model (QWEN3_0_6B) at the rates its shapes attain here."""
    flops = workload_flops(model, lengths, layers, width)
    rows = round(BATCH_ITEMS * flops["mean_tokens"])
    roof = measure(linear_shapes(model), rows, cpu)
    fp32 = roof["gflops"]["fp32"]
    paths = {}
    for path, items_per_s in rates.items():
        gflops = items_per_s * flops["flops"] / flops["texts"] / 1e9
        paths[path] = {"items_per_s": items_per_s, "effective_gflops": gflops, "fp32_roofline_fraction": gflops / fp32}
    real = QWEN3_0_6B
    per_text = flops_per_token(real["shapes"], real["layers"], real["attention_width"], flops["attention_span"]) * flops["mean_tokens"]
    real_roof = measure(real["shapes"], rows, cpu, repeats=5)
    bound = {precision: rate * 1e9 / per_text for precision, rate in real_roof["gflops"].items() if isinstance(rate, float)}
    return {
        "flops": flops,
        "roofline": roof,
        "paths": paths,
        "real_size": {"model": real["model"], "flops_per_text": per_text, "roofline_gflops": real_roof["gflops"], "roofline_bound_items_per_s": bound},
    }


def served_lines(figures: dict[str, Any], labels: dict[str, str], unit: str = "texts") -> list[str]:
    """Markdown for `served`'s figures: the paths' share of the roofline, and the real-size bound (in `unit`/s)."""
    flops, rates = figures["flops"], figures["roofline"]["gflops"]
    real = figures["real_size"]
    shares = "; ".join(
        f"{labels[path]} {row['effective_gflops']:.1f} GFLOP/s effective, **{row['fp32_roofline_fraction']:.2f}** of it"
        for path, row in figures["paths"].items()
    )
    bound = ", ".join(f"{precision} {rate:.1f}" for precision, rate in real["roofline_bound_items_per_s"].items() if precision in ("fp32", "bf16"))
    return [
        f"Roofline (`bench/roofline.py`, the replica's own Linear shapes at {figures['roofline']['rows']} rows): fp32 "
        f"{rates['fp32']:.0f} GFLOP/s. The texts are {flops['tokens']:,} real tokens (mean {flops['mean_tokens']:.1f}), "
        f"{flops['flops_per_token'] / 1e6:.2f} MFLOP a token (tokens counted by the replica's tokenizer, which splits "
        f"words finer than a real one, so the real-size bound below is on the low side): {shares}. A replica this small is mostly overhead (tokenizing, "
        f"dispatch, a matmul too small to fill the cores), so its fraction says little about a real model's.",
        "",
        f"At real size ({real['model']}) the same texts cost {real['flops_per_text'] / 1e9:.1f} GFLOP each, and its shapes "
        f"run here at fp32 {real['roofline_gflops']['fp32']:.0f} GFLOP/s: at most **{bound} {unit}/s** on this machine "
        "if every FLOP ran at the matmul rate. Matmuls are then nearly all of the work, so a served model comes near "
        "the fraction of the roofline the MiniLM encoder reaches (the CPU section above), not the replica's.",
    ]
