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

REPEATS = 20
# Tokens in one measured matmul: the worker's default batch (64 requests' items) of the workload's mean length.
BATCH_ITEMS = 64


def linear_shapes(model: torch.nn.Module) -> dict[tuple[int, int], int]:
    """(in_features, out_features) of every nn.Linear that runs on every token, with how many there are.

    A pooler runs on one token per sequence, not per token, and is left out."""
    shapes: collections.Counter[tuple[int, int]] = collections.Counter()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and "pooler" not in name.split("."):
            shapes[(module.in_features, module.out_features)] += 1
    return dict(shapes)


def attention_span(lengths: Sequence[int]) -> float:
    """The mean number of keys a token attends to: sum(L^2) / sum(L) over the sequences' real lengths
    (a token of a sequence of L tokens attends to L), so that per-token FLOPs times tokens is exact."""
    return sum(length * length for length in lengths) / sum(lengths)


def flops_per_token(shapes: dict[tuple[int, int], int], layers: int, hidden: int, span: float) -> float:
    """2*in*out per Linear (a multiply and an add per weight), plus attention's two matmuls (Q.K^T and
    softmax.V: 2 FLOPs * span * hidden each) in each layer."""
    linear = sum(2 * inputs * outputs * count for (inputs, outputs), count in shapes.items())
    return linear + layers * 2 * 2 * span * hidden


def workload_flops(model: torch.nn.Module, lengths: Sequence[int], layers: int, hidden: int) -> dict[str, Any]:
    """The workload's real tokens (no padding) and FLOPs, given each text's token count."""
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
    kernels: dict[str, Callable[[], object] | str] = {"fp32": lambda: F.linear(x, w)}
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
    "fp32": "torch.nn.functional.linear, float32",
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
            per_shape[_name(rows, inputs, outputs)] = figures
    measured = {
        "rows": rows,
        "shapes": [[inputs, outputs, count] for (inputs, outputs), count in shapes.items()],
        "torch_threads": torch.get_num_threads(),
        "repeats": repeats,
        "kernels": KERNELS,
        "per_shape_gflops": per_shape,
    }
    return {**measured, "gflops": _overall(measured)}


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
