"""Float32 CPU inference on oneDNN: Linear layers on prepacked weights, BERT's GELU fused into its matmul.

PyTorch's CPU `Linear` calls MKL's sgemm on the plain weight each time. Packed
once into oneDNN's blocked layout, the same float32 matmuls run 1.1-1.4x
faster on the development machine's AVX-512 EPYC (docs/benchmarks.md), and
the GELU of BERT-style feed-forward blocks can run inside the matmul instead
of as a pass of its own. Results differ from PyTorch's only by float32
rounding order. The plain weights stay where they were, for LoRA adapters,
tied weights and anything else that reads them; the packed copy is a
non-persistent buffer, so it counts in the model's memory and not in its
state dict.

The same packing in bfloat16 (`use_onednn(model, torch.bfloat16)`) gives a
float32 model bfloat16 matmuls and nothing else: each Linear rounds its
input to bfloat16, multiplies with float32 accumulation and hands its output
back in float32, so the residual stream, LayerNorms, attention and GELU stay
float32 (sie_worker.models.cpu_precision says why).
"""

from __future__ import annotations

import logging
from typing import cast

import torch
from transformers.activations import GELUActivation

log = logging.getLogger(__name__)


class PackedLinear(torch.nn.Linear):
    """An `nn.Linear` (peft and isinstance checks still see one) whose forward uses a oneDNN-packed copy of its
    weight."""

    packed_weight: torch.Tensor

    def forward(self, input: torch.Tensor, activation: str = "none") -> torch.Tensor:
        return packed_matmul(input, self.packed_weight, self.bias, activation)


def packed_matmul(
    input: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, activation: str = "none"
) -> torch.Tensor:
    """`input` times a oneDNN-packed float32 weight, plus `bias`, then `activation` ("none" or "gelu") in the same
    kernel: a PackedLinear's forward without the module call (sie_worker.kernels.unpadded calls it directly)."""
    # The last argument picks the activation's variant: for GELU, "none" is the exact (erf) form BERT uses.
    variant = "none" if activation == "gelu" else ""
    return torch.ops.mkldnn._linear_pointwise(input, packed, bias, activation, [], variant)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A weight [out, in] (float32, or bfloat16) in oneDNN's packed layout, for `packed_matmul` (float32)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


class PackedBf16Linear(PackedLinear):
    """A float32 `nn.Linear` whose matmul runs in bfloat16 on a oneDNN-packed bfloat16 copy of its weight; it takes
    float32 (or bfloat16) and answers float32."""

    packed_bias: torch.Tensor | None

    def forward(self, input: torch.Tensor, activation: str = "none") -> torch.Tensor:
        variant = "none" if activation == "gelu" else ""
        rounded = input.to(torch.bfloat16)
        out = torch.ops.mkldnn._linear_pointwise(rounded, self.packed_weight, self.packed_bias, activation, [], variant)
        # A fused GELU's output feeds only the block's down-projection (`DenseGelu`), which rounds it to bfloat16
        # again: it stays bfloat16, saving two passes over the widest activation.
        return out if activation == "gelu" else out.float()


class DenseGelu(torch.nn.Module):
    """BERT's feed-forward up-projection, gelu(dense(x)), with the GELU inside the matmul.

    Keeps the attribute name `dense`, so LoRA target names still match. Once
    peft has wrapped `dense` in a LoRA layer, the GELU must apply after the
    LoRA delta is added, so it runs as a separate step again.
    """

    def __init__(self, dense: PackedLinear) -> None:
        super().__init__()
        self.dense: torch.nn.Module = dense

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if type(self.dense) in (PackedLinear, PackedBf16Linear):
            return self.dense(hidden_states, activation="gelu")
        return torch.nn.functional.gelu(self.dense(hidden_states))


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def use_onednn(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Pack every float32 `nn.Linear` of a CPU model, its weight in `dtype` (float32, or bfloat16 for bfloat16
    matmuls), and fuse BERT-style GELU blocks; returns how many layers were packed.

    Leaves the model as it was (and says so in the log) where this PyTorch
    build cannot pack a weight, or where its packed matmul disagrees with
    PyTorch's on this CPU.
    """
    linears = [
        module for module in model.modules() if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
    ]
    if not linears or not onednn_available():
        return 0
    try:
        packed = [pack(linear.weight.detach().to(dtype)) for linear in linears]
        agrees = packed_matches(linears[0], packed[0], dtype)
    except RuntimeError as error:
        log.warning("oneDNN cannot pack this model's Linear weights (%s); it runs on plain PyTorch", error)
        return 0
    if not agrees:
        log.warning("oneDNN's packed matmul disagrees with PyTorch's on this machine; the model runs on plain PyTorch")
        return 0
    for linear, weight in zip(linears, packed, strict=True):
        linear.register_buffer("packed_weight", weight, persistent=False)
        if dtype == torch.float32:
            linear.__class__ = PackedLinear
        else:
            linear.__class__ = PackedBf16Linear
            bias = None if linear.bias is None else linear.bias.detach().to(dtype)
            linear.register_buffer("packed_bias", bias, persistent=False)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if _is_dense_gelu(child):
                setattr(parent, name, DenseGelu(cast(PackedLinear, child.dense)))  # its type checked just above
    return len(linears)


def packed_matches(linear: torch.nn.Linear, packed: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    """Whether `packed` (in `dtype`) computes what `linear` does, on a few random rows: a check, at load, of the
    build's oneDNN kernels on this CPU before a model's requests depend on them. bfloat16 is held to a bar its
    8-bit mantissa meets (2^-8 of the largest output, and relative)."""
    rows = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0))
    tolerance = 1e-4 if dtype == torch.float32 else 2**-6
    with torch.inference_mode():
        expected = torch.nn.functional.linear(rows, linear.weight, linear.bias)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype)
        got = torch.ops.mkldnn._linear_pointwise(rows.to(dtype), packed, bias, "none", [], "").float()
    return torch.allclose(got, expected, rtol=tolerance, atol=tolerance * float(expected.abs().max()) + 1e-6)


def _is_dense_gelu(module: torch.nn.Module) -> bool:
    """A BERT-family `...Intermediate` block: exactly `dense` then an exact (erf) GELU."""
    children = dict(module.named_children())
    activation = children.get("intermediate_act_fn")
    return (
        type(module).__name__.endswith("Intermediate")
        and set(children) == {"dense", "intermediate_act_fn"}
        and type(children["dense"]) in (PackedLinear, PackedBf16Linear)
        and type(activation) is GELUActivation
        and activation.act is torch.nn.functional.gelu
    )
