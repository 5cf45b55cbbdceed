"""int8 Linear layers that keep a float32 model's answers, and the calibration that decides which layers get them.

Each `Int8Linear` multiplies int8 by int8 into int32 (`torch._int_mm`, VNNI):
its weight quantised per output channel, its input per token (row) as it
comes, so one item's outputs never depend on what else is in the batch, and a
token with large values costs no precision to the others. Some input channels
run far larger than the rest (all-MiniLM-L6-v2's hidden channel 99 reaches 15
to 18 times the median channel after LayerNorm, the feed-forward output's
inputs up to 25 times): SmoothQuant-style, each input channel is divided by
`smoothing` before quantising and the weight's matching column multiplied by
it, so the product is unchanged and the range moves from the activations to the
weight, which is quantised per channel.

`calibrate` measures at load, on a calibration probe, each input channel's
range (for the smoothing) and how far quantising each Linear alone moves the
model's outputs from float32; `plan` then takes layers into int8, least
harmful first, while their summed drift stays within a budget. The others
keep their float32 (or bfloat16-matmul) path: on all-MiniLM-L6-v2 the
feed-forward output layers alone move the embeddings about 60 times more than
bfloat16 matmuls do, and the whole model in int8 leaves 62-69 of 100 retrieval
queries their top 10 (docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch

# Smoothing exponent: 0.5 splits an input channel's range evenly between the activation and the weight.
SMOOTHING_ALPHA = 0.5
_TINY = 1e-8
Outputs = TypeVar("Outputs")


class Int8Linear(torch.nn.Module):
    """`linear` with an int8 weight (one scale per output channel) and its input quantised per row."""

    weight_int8: torch.Tensor
    weight_scale: torch.Tensor
    input_divisor: torch.Tensor | None
    bias: torch.Tensor | None

    def __init__(self, linear: torch.nn.Linear, smoothing: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        if smoothing is not None:
            weight = weight * smoothing
        scale = weight.abs().amax(dim=1).clamp(min=_TINY) / 127
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("weight_int8", quantized.t().contiguous())  # [in, out], as _int_mm takes it
        self.register_buffer("weight_scale", scale)
        self.register_buffer("input_divisor", None if smoothing is None else smoothing.float())
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features).float()
        if self.input_divisor is not None:
            rows = rows / self.input_divisor
        scale = torch.linalg.vector_norm(rows, ord=float("inf"), dim=1, keepdim=True).clamp_(min=_TINY).div_(127)
        quantized = torch.round(rows / scale).to(torch.int8)
        out = torch._int_mm(quantized, self.weight_int8) * scale  # int32 * float32: one pass, float32 out
        out = out.mul_(self.weight_scale) if self.bias is None else torch.addcmul(self.bias, out, self.weight_scale)
        return out.reshape(*input.shape[:-1], self.out_features)  # float32, whatever came in


def smoothing_for(input_range: torch.Tensor, weight: torch.Tensor, alpha: float = SMOOTHING_ALPHA) -> torch.Tensor:
    """Per input channel: max|x|^alpha / max|w|^(1-alpha), from the channel's measured input range and its
    weight column."""
    weight_range = weight.detach().float().abs().amax(dim=0).clamp(min=1e-5)
    return (input_range.clamp(min=1e-5) ** alpha / weight_range ** (1 - alpha)).clamp(min=1e-5)


def linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Linear]]:
    """The model's float32 Linear layers (subclasses too: oneDNN-packed ones), by name."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and module.weight.dtype == torch.float32
    ]


def replace(model: torch.nn.Module, name: str, module: torch.nn.Module) -> torch.nn.Module:
    """Put `module` at `name` in `model`; returns the one it replaced."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    old = getattr(parent, child)
    setattr(parent, child, module)
    return old


def input_ranges(model: torch.nn.Module, run: Callable[[], object]) -> dict[str, torch.Tensor]:
    """Each Linear's largest |input| per channel over what `run` feeds the model."""
    ranges: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def record(_: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            seen = args[0].detach().reshape(-1, args[0].shape[-1]).abs().amax(dim=0).float()
            ranges[name] = torch.maximum(ranges[name], seen) if name in ranges else seen

        return record

    handles = [module.register_forward_pre_hook(hook(name)) for name, module in linears(model)]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return ranges


@dataclass(frozen=True)
class Calibration:
    """Per Linear (by name): its smoothing and how far int8 in it alone moves the outputs (1 - min cosine)."""

    smoothing: dict[str, torch.Tensor]
    drift: dict[str, float]


def calibrate(
    model: torch.nn.Module, run: Callable[[], Outputs], disagreement: Callable[[Outputs], float]
) -> Calibration:
    """`run()` feeds the calibration probe through `model` (float32) and returns its outputs; `disagreement(outputs)`
    says how far they are from float32's. Each Linear goes to int8 alone, is measured, and comes back."""
    ranges = input_ranges(model, run)
    smoothing: dict[str, torch.Tensor] = {}
    drift: dict[str, float] = {}
    for name, linear in linears(model):
        if name not in ranges:  # never called on the probe (a head the adapter does not run)
            continue
        smoothing[name] = smoothing_for(ranges[name], linear.weight)
        replace(model, name, Int8Linear(linear, smoothing[name]))
        try:
            drift[name] = disagreement(run())
        finally:
            replace(model, name, linear)
    return Calibration(smoothing, drift)


def plan(drift: dict[str, float], budget: float) -> list[str]:
    """The layers to quantise: the least drifting first, while their summed drift stays within `budget`."""
    chosen: list[str] = []
    spent = 0.0
    for name, cost in sorted(drift.items(), key=lambda item: item[1]):
        if spent + cost > budget:
            break
        chosen.append(name)
        spent += cost
    return chosen


def quantize(model: torch.nn.Module, calibration: Calibration, names: Iterable[str]) -> int:
    """Swap the named Linear layers of `model` for int8 ones; returns how many."""
    layers = dict(linears(model))
    count = 0
    for name in names:
        replace(model, name, Int8Linear(layers[name], calibration.smoothing[name]))
        count += 1
    return count
