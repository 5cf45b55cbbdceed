"""Reduced precision on a CPU: which precision a model runs in, and a check that it still answers like float32.

A CPU runs bfloat16 matmuls fast only with AVX512-BF16 or AMX-BF16, and int8
ones only with VNNI (AVX512-VNNI, AVX-VNNI or AMX-INT8); elsewhere the math is
emulated, slower than float32, so the model runs in float32 and the log says
why.

bfloat16 keeps the model in float32 and runs its Linear layers' matmuls in
bfloat16 (oneDNN-packed bfloat16 weights, float32 accumulation, float32 out,
sie_worker.kernels.onednn): the residual stream, LayerNorms, attention and
GELU stay float32. On all-MiniLM-L6-v2 that moves the embeddings about a tenth
as far as the whole model in bfloat16 (weights, residual stream and all), which
cost 8 of 100 retrieval queries their top 10 (docs/benchmarks.md). A model
whose Linear layers oneDNN cannot pack runs wholly in bfloat16 instead.

int8 quantises the Linear layers that a calibration probe says can take it
(sie_worker.kernels.int8: per-token activations, per-channel weights,
SmoothQuant-style smoothing measured on the probe), least harmful first, while
their summed drift stays within SIE_INT8_MAX_DRIFT; the others run bfloat16
matmuls where the CPU has them, float32 otherwise.

A reduced-precision model is checked once at load against float32 on a fixed
probe: the float32 model is built and probed first, freed, then the reduced one
is built and probed, so two copies are never resident at once. Where the two
disagree past the bar the reduced model is dropped and float32 built again.
"""

from __future__ import annotations

import gc
import logging
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sie_worker.adapters.contract import Adapter, Input, Query
from sie_worker.kernels import int8
from sie_worker.kernels.onednn import use_onednn

log = logging.getLogger(__name__)

_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})

# Texts of different lengths and kinds; short enough that the probe costs a few forward passes of one small batch.
PROBE_TEXTS = (
    "what is the capital of france",
    "Paris is the capital and most populous city of France.",
    "The mitochondrion is the powerhouse of the cell, producing most of its ATP through oxidative phosphorylation.",
    "def add(a, b):\n    return a + b",
    "Wie spät ist es?",
    "1 2 3 4 5 6 7 8 9 10",
    "A quiet street at night, rain on the windows, a cat asleep on the sill while the kettle starts to whistle.",
    "ok",
)
PROBE_QUERY = "which city is the capital of france"
# What int8 calibrates on: other texts than the check's probe, so that the check does not grade its own homework.
CALIBRATION_TEXTS = (
    "how do I reset a forgotten password",
    "The train to the airport leaves every twenty minutes from the second platform.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen in the leaves of green plants.",
    "SELECT name, count(*) FROM orders GROUP BY name ORDER BY 2 DESC;",
    "Le chat dort sur le canapé depuis ce matin.",
    "Returns the number of items in the list; raises TypeError if the argument is not a sequence.",
    "best pizza near me open late",
    "In 1969 two astronauts walked on the Moon while a third orbited above them, waiting to bring them home.",
)


def cpu_flags(override: str | None = None) -> frozenset[str]:
    """The ISA flags of this CPU: `override` (a space-separated list) where given, else /proc/cpuinfo's first
    `flags` line (empty where there is none, as on macOS)."""
    if override is not None:
        return frozenset(override.split())
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    return parse_cpu_flags(text)


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def auto_precision(flags: frozenset[str]) -> str:
    """The worker default under `auto`: bfloat16 on AMX, where bf16 matmuls run several times faster than float32;
    float32 elsewhere (AVX512-BF16 alone gains too little to trade precision for, and int8 only some models)."""
    return "bfloat16" if "amx_bf16" in flags else "float32"


def cpu_precision(requested: str, flags: frozenset[str]) -> tuple[str, str | None]:
    """The precision a CPU model runs in for a requested one (a profile's, else the worker's default), and why it
    differs where it does."""
    if requested == "auto":
        return auto_precision(flags), None
    if requested == "bfloat16" and not flags & _BF16_FLAGS:
        return "float32", "bfloat16 needs AVX512-BF16 or AMX-BF16, which this CPU lacks"
    if requested == "int8" and not flags & _INT8_FLAGS:
        return "float32", "int8 needs AVX512-VNNI, AVX-VNNI or AMX-INT8, which this CPU lacks"
    if requested == "float16":
        return "float32", "float16 is an accelerator precision; CPUs compute in float32"
    return requested, None


def quantize_linears(model: torch.nn.Module) -> None:
    """Replace every plain `nn.Linear` of `model` with a dynamically quantised int8 one (per-tensor scales), in
    place: the int8 of old, which SIE_INT8_MAX_DRIFT=2 all but reproduces with better scales; kept for the
    benchmark's comparison (bench/precision_run.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization warns of its deprecation on every call
        torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def use_bf16_matmuls(adapter: Adapter) -> bool:
    """Give a float32 adapter's model bfloat16 matmuls (float32 everywhere else); False where oneDNN cannot pack
    its Linear layers (the model is then unchanged)."""
    return use_onednn(adapter.model, torch.bfloat16) > 0


def use_int8(adapter: Adapter, max_drift: float, *, bf16: bool) -> tuple[int, int]:
    """Quantise the Linear layers of a float32 adapter's model that the calibration probe lets into int8 within
    `max_drift`; the others get bfloat16 matmuls where `bf16`, oneDNN-packed float32 ones otherwise. Returns
    (layers in int8, Linear layers)."""
    reference = probe(adapter, CALIBRATION_TEXTS)

    def run() -> Probe:
        return probe(adapter, CALIBRATION_TEXTS)

    calibration = int8.calibrate(adapter.model, run, lambda outputs: 1.0 - compare(reference, outputs))
    total = len(int8.linears(adapter.model))
    quantized = int8.quantize(adapter.model, calibration, int8.plan(calibration.drift, max_drift))
    use_onednn(adapter.model, torch.bfloat16 if bf16 else torch.float32)
    return quantized, total


@dataclass(frozen=True)
class CpuBuild:
    """A CPU model built by `load_on_cpu`: its adapter, the precision it computes in and the probe's agreement
    with float32 (None where no probe ran)."""

    adapter: Adapter
    precision: str
    agreement: float | None


class Build(Protocol):
    """Builds the model's adapter with its weights in `dtype`, its float32 Linear layers packed for oneDNN or not."""

    def __call__(self, dtype: torch.dtype, *, cpu_onednn: bool) -> Adapter: ...


def load_on_cpu(
    name: str,
    requested: str,
    flags: frozenset[str],
    build: Build,
    *,
    onednn: bool,
    min_agreement: float,
    has_loras: bool,
    int8_max_drift: float = 1e-5,
) -> CpuBuild:
    """The model in the `requested` precision where this CPU (`flags`) runs it and the probe agrees with float32 to
    `min_agreement`; float32 otherwise, with a log line naming the model (`name`) and why."""
    precision, why = cpu_precision(requested, flags)
    if why:
        log.info("%s: %s; it computes in float32", name, why)

    def at(chosen: str) -> Adapter:
        if chosen == "bfloat16":
            adapter = build(torch.float32, cpu_onednn=False)  # packed here, in bfloat16
            if use_bf16_matmuls(adapter):
                return adapter
            del adapter
            return build(torch.bfloat16, cpu_onednn=False)
        if chosen == "int8":
            adapter = build(torch.float32, cpu_onednn=False)  # int8 layers replace some of those oneDNN would pack
            quantized, total = use_int8(adapter, int8_max_drift, bf16=bool(flags & _BF16_FLAGS))
            log.info(
                "%s: %d of %d Linear layers in int8 (SIE_INT8_MAX_DRIFT %g)", name, quantized, total, int8_max_drift
            )
            return adapter
        return build(torch.float32, cpu_onednn=onednn)

    return _checked(name, precision, at, min_agreement, has_loras=has_loras)


def _checked(
    name: str, precision: str, build: Callable[[str], Adapter], min_agreement: float, *, has_loras: bool
) -> CpuBuild:
    """`build(precision)`, checked against `build("float32")` on the probe; float32 where the check fails or cannot
    run."""
    adapter = build("float32")
    if precision == "float32":
        return CpuBuild(adapter, "float32", None)
    why = _unsupported(adapter, precision, has_loras)
    if why:
        log.warning("%s: %s; it computes in float32", name, why)
        return CpuBuild(adapter, "float32", None)
    reference = probe(adapter)
    del adapter
    gc.collect()
    adapter = build(precision)
    agreement = compare(reference, probe(adapter))
    if agreement < min_agreement:
        log.warning(
            "%s: %s outputs drift from float32 on the probe (cosine %.5f < %.5f); it computes in float32",
            name,
            precision,
            agreement,
            min_agreement,
        )
        del adapter
        gc.collect()
        return CpuBuild(build("float32"), "float32", agreement)
    log.info("%s computes in %s on this CPU (probe cosine to float32 %.5f)", name, precision, agreement)
    return CpuBuild(adapter, precision, agreement)


def _unsupported(adapter: Adapter, precision: str, has_loras: bool) -> str | None:
    spec = adapter.spec
    if "image" in spec.inputs or not (spec.outputs or spec.pairs):
        return f"{precision} is checked on text encoders and cross-encoders only, and this model is neither"
    if precision == "int8" and has_loras:
        return "int8 layers take no LoRA adapters"
    return None


Probe = list[np.ndarray]


def probe(adapter: Adapter, texts: tuple[str, ...] = PROBE_TEXTS) -> Probe:
    """The adapter's outputs on `texts` (the probe's by default), as float64 vectors to compare: one per dense
    embedding, per multivector row and per sparse embedding (densified); a cross-encoder's scores as one vector,
    centred on their mean, so that its cosine is their correlation: a shared offset does not hide a change in their
    order."""
    spec = adapter.spec
    if not (spec.outputs or spec.pairs):
        raise TypeError(f"no probe for {type(adapter).__name__}")
    query = Query("score") if spec.pairs else Query("encode", outputs=spec.outputs)
    items = [Input(text, pair=PROBE_QUERY if spec.pairs else None) for text in texts]
    with torch.inference_mode():
        outputs = adapter.run([prepared.value for prepared in adapter.prepare(items, query)], query)
    if spec.pairs:
        scores = np.asarray(outputs, dtype=np.float64)
        return [scores - scores.mean()]
    vectors: Probe = []
    for item in outputs:
        if item.dense is not None:
            vectors.append(np.asarray(item.dense, dtype=np.float64))
        if item.multivector is not None:
            vectors.extend(np.asarray(item.multivector, dtype=np.float64))
        if item.sparse is not None:
            dense = np.zeros(item.sparse.dims, dtype=np.float64)
            dense[item.sparse.indices] = item.sparse.values
            vectors.append(dense)
    return vectors


def compare(reference: Probe, got: Probe) -> float:
    """The smallest cosine between matching vectors (1.0 where both are zero). Probes of different shapes, or a
    cosine that is not finite (min() would skip a NaN), give -inf: below every bar SIE_PRECISION_MIN_COSINE accepts,
    -1 included."""
    if len(reference) != len(got) or any(a.shape != b.shape for a, b in zip(reference, got, strict=True)):
        return -math.inf
    worst = 1.0
    for expected, actual in zip(reference, got, strict=True):
        norms = float(np.linalg.norm(expected) * np.linalg.norm(actual))
        if norms == 0.0:
            cosine = 1.0 if not expected.any() and not actual.any() else 0.0
        else:
            cosine = float(expected @ actual) / norms
        if not np.isfinite(cosine):
            return -math.inf
        worst = min(worst, cosine)
    return worst
