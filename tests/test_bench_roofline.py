"""The harness's view of the machine: its kind from cpuinfo, the model's FLOPs, the matmul roofline, one docs section
per machine kind (merged, never overwriting another kind's), and ONNX Runtime's vectors against torch's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import precision
import pytest
import report
import roofline
import torch
from machine import parse_cpuinfo, slug

AMD_FLAGS = (
    "fpu sse sse2 avx f16c avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi avx512_vnni fsrm"
)
INTEL_FLAGS = (
    "fpu sse sse2 avx avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx_vnni avx512_vnni "
    "amx_bf16 avx512_fp16 amx_tile amx_int8"
)


def cpuinfo(vendor: str, model: str, flags: str, family: int = 25, number: int = 17) -> str:
    block = (
        f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {number}\n"
        f"model name\t: {model}\nflags\t\t: {flags}\n"
    )
    return "\n".join(block.format(n=n) for n in range(2))


def test_machine_kind_from_cpuinfo() -> None:
    amd = parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC", AMD_FLAGS))
    intel = parse_cpuinfo(cpuinfo("GenuineIntel", "Intel(R) Xeon(R) Platinum 8480+", INTEL_FLAGS, 6, 143))
    newer_amd = parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC", AMD_FLAGS, 26, 2))

    assert (amd.kind, slug(amd.kind)) == (
        "AMD EPYC family 25 model 17 (avx512f, avx512_bf16, avx512_vnni; no AMX)",
        "amd-epyc-family-25-model-17-avx512f-avx512-bf16-avx512-vnni-no-amx",
    )
    assert slug(intel.kind) == (
        "intel-xeon-family-6-model-143-avx512f-avx512-bf16-avx512-vnni-avx-vnni-amx-bf16-amx-int8-amx"
    )
    # Two EPYCs with the same flags but of different families are machines of different kinds.
    assert newer_amd.kind != amd.kind and "family 26 model 2" in newer_amd.kind
    assert amd.isa == ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]
    assert intel.isa == [
        "avx2",
        "avx512f",
        "avx512_bf16",
        "avx512_vnni",
        "avx_vnni",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ]
    assert (amd.bf16, amd.vnni, amd.amx) == (True, True, False)
    old = parse_cpuinfo(cpuinfo("GenuineIntel", "Intel(R) Core(TM) i7-6700", "sse avx avx2"))
    assert (old.kind, old.bf16, old.vnni) == ("Intel Core family 25 model 17 (no AVX-512; no AMX)", False, False)


def test_flops_per_token_of_a_minilm_layout() -> None:
    shapes_of_a_layer = {
        "q": (384, 384),
        "k": (384, 384),
        "v": (384, 384),
        "o": (384, 384),
        "up": (384, 1536),
        "down": (1536, 384),
    }
    layers = torch.nn.ModuleList(
        torch.nn.ModuleDict({name: torch.nn.Linear(*shape) for name, shape in shapes_of_a_layer.items()})
        for _ in range(6)
    )
    model = torch.nn.ModuleDict({"layers": layers, "pooler": torch.nn.Linear(384, 384)})

    shapes = roofline.linear_shapes(model)
    assert shapes == {(384, 384): 24, (384, 1536): 6, (1536, 384): 6}  # the pooler runs once per text: left out
    # Texts of 10 and 30 tokens: a token attends to (10*10 + 30*30) / 40 = 25 keys on average.
    assert roofline.attention_span([10, 30]) == 25
    per_token = roofline.flops_per_token(shapes, layers=6, hidden=384, span=25)
    assert per_token == 6 * 2 * (4 * 384 * 384 + 2 * 384 * 1536) + 6 * 2 * 2 * 25 * 384 == 21_233_664 + 230_400
    flops = roofline.workload_flops(model, [10, 30], layers=6, hidden=384)
    assert (flops["tokens"], flops["flops"]) == (40, per_token * 40)


def test_roofline_measures_positive_fp32_rates_on_tiny_shapes() -> None:
    no_reduced_precision = parse_cpuinfo(cpuinfo("AuthenticAMD", "AMD EPYC", "avx2"))
    measured = roofline.measure({(16, 32): 2, (32, 16): 1}, rows=8, cpu=no_reduced_precision, repeats=2)

    assert measured["gflops"]["fp32"] > 0
    assert measured["gflops"]["bf16"].startswith("unsupported")
    assert measured["gflops"]["int8"].startswith("unsupported")
    assert all(figures["fp32"] > 0 for figures in measured["per_shape_gflops"].values())
    # The fp32 roofline is the faster of PyTorch's own Linear and the oneDNN-packed matmul the worker runs, per shape.
    for figures in measured["per_shape_gflops"].values():
        assert figures["fp32"] == max(figures["fp32-mkl"], figures["fp32-onednn"])
    again = roofline.measure({(16, 32): 2, (32, 16): 1}, rows=8, cpu=no_reduced_precision, repeats=2)
    best = roofline.best_of(measured, again)
    assert best["gflops"]["fp32"] >= min(measured["gflops"]["fp32"], again["gflops"]["fp32"])
    assert best["gflops"]["bf16"] == measured["gflops"]["bf16"]


def _result(kind: str, paths: dict[str, float], date: str) -> dict:
    return {
        "date": date,
        "machine": {
            "cpu": kind,
            "kind": kind,
            "isa": [],
            "cores": 2,
            "python": "3.11",
            "torch": "2.13",
            "transformers": "5",
            "sentence_transformers": "6",
            "grpcio": "1",
        },
        "settings": {
            "runs": 1,
            "clients": 4,
            "device": "cpu",
            "attention": "default",
            "SIE_MAX_BATCH_WAIT_MS": "adaptive",
            "torch_threads": 2,
        },
        "model": "m",
        "workloads": {"bulk": "texts"},
        "paths": {
            key: {"label": key, "bulk": {"median": rate, "min": rate, "max": rate, "runs": 1}}
            for key, rate in paths.items()
        },
        "targets": [],
    }


def test_docs_sections_per_machine_kind_merge_rows_and_leave_other_kinds_alone(tmp_path: Path) -> None:
    docs = tmp_path / "docs" / "benchmarks.md"
    docs.parent.mkdir()
    marker = "generated: cpu-intel-xeon-amx -->"
    intel_section = f"<!-- begin {marker}\nIntel figures, by hand.\n<!-- end {marker}"
    docs.write_text(f"# Benchmarks\n\n## CPU\n\n### Intel Xeon, AMX\n\n{intel_section}\n\n## GPU\n\nnothing\n")
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)

    def record(name: str, result: dict) -> None:
        (results / name).write_text(json.dumps(result))
        report.write_docs(result, Path("bench/results") / name, docs, root=tmp_path)

    # A kind seen for the first time gets its own section at the end of the CPU part.
    record(
        "full.json",
        _result("AMD EPYC, no AMX", {"in-process": 200.0, "worker": 300.0, "onnxruntime": 150.0}, "2026-11-24"),
    )
    # A run of two paths replaces their rows and keeps the third, marked with where it comes from.
    record("partial.json", _result("AMD EPYC, no AMX", {"in-process": 210.0, "worker": 333.0}, "2026-11-25"))

    text = docs.read_text()
    assert intel_section in text
    assert text.index("### AMD EPYC, no AMX") < text.index("## GPU")
    amd = text.split("<!-- begin generated: cpu-amd-epyc-no-amx -->")[1].split(
        "<!-- end generated: cpu-amd-epyc-no-amx -->"
    )[0]
    rows = [line for line in amd.splitlines() if line.startswith("| ") and "(" in line and "items/s" not in line]
    assert [row.split(" | ")[1] for row in rows] == ["210 (210-210)", "333 (333-333)", "150 (150-150)"]
    assert "onnxruntime (not in this run: 2026-11-24, `bench/results/full.json`)" in rows[2]
    assert "300" not in amd

    # An Intel run rewrites only the Intel section.
    record("intel.json", _result("Intel Xeon, AMX", {"worker": 377.0}, "2026-11-26"))
    after = docs.read_text()
    assert after.split("### Intel Xeon, AMX")[0] == text.split("### Intel Xeon, AMX")[0]
    assert amd in after and "Intel figures, by hand." not in after and "377 (377-377)" in after


@pytest.mark.slow
def test_onnx_export_of_a_tiny_bert_matches_torch(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript", reason="torch.onnx's dynamo exporter needs onnx and onnxscript (the test extra)")
    import onnxrt
    from sentence_transformers import SentenceTransformer

    from tiny_models import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "tiny", pooling="mean", normalize=True, include_prompt=True)
    texts = [
        "a short query about search",
        "a longer text " * 9,
        "one",
        "the ONNX export keeps dynamic batch and length",
    ]
    reference = SentenceTransformer(str(model_dir), device="cpu")
    peer = onnxrt.OnnxRuntimePeer(model_dir, tmp_path, threads=1, max_length=reference.max_seq_length)

    peer.check(texts, reference.encode(texts))  # raises below cosine 0.9999, for the exported and the optimized graph
    assert set(peer.notes["min_cosine_vs_sentence_transformers"]) == set(peer.graphs)
    assert np.allclose(peer.encoder.encode(texts, batch_size=3), reference.encode(texts), atol=1e-5)


def test_agreement_counts_the_worst_cosine_and_the_queries_whose_neighbours_move() -> None:
    rng = np.random.default_rng(0)
    corpus, queries = rng.normal(size=(300, 16)), rng.normal(size=(20, 16))
    assert precision.cosines(corpus, corpus * 3)["min_cosine"] == pytest.approx(1.0)  # scale does not change a cosine
    same = precision.neighbours((queries, corpus), (queries, corpus * 3))
    assert (same["queries"], same["corpus"], same["same_top_k_set"], same["same_top_k_order"]) == (20, 300, 20, 20)

    moved = queries.copy()
    moved[0] = -queries[0]  # query 0 turns around: its nearest become its farthest; the other 19 keep theirs
    assert precision.cosines(queries, moved)["min_cosine"] == pytest.approx(-1.0)
    assert precision.neighbours((queries, corpus), (moved, corpus))["same_top_k_set"] == 19
    with pytest.raises(ValueError, match="shapes differ"):
        precision.cosines(corpus, corpus[:10])


def test_a_swap_at_the_tenth_place_within_a_near_tie_is_told_apart_from_a_real_move() -> None:
    def at(cosines: list[float]) -> np.ndarray:  # unit vectors at these cosines to the query [1, 0]
        return np.array([[c, np.sqrt(1 - c * c)] for c in cosines])

    query = np.array([[1.0, 0.0]])
    scores = [0.99 - 0.01 * rank for rank in range(10)] + [0.8999, 0.5]  # the 11th is 1e-4 below the 10th
    tied = scores[:9] + [0.8999, 0.9000, 0.5]  # the 10th and 11th trade places
    moved = scores[:9] + [0.8999, 0.5, 0.9]  # the 12th, far below in float32, enters
    reference = (query, at(scores))
    assert precision.neighbours(reference, (query, at(tied)))["changed_by_near_ties_only"] == 1
    real = precision.neighbours(reference, (query, at(moved)))
    assert (real["same_top_k_set"], real["changed_by_near_ties_only"]) == (0, 0)


def test_the_retrieval_set_is_real_paragraphs_and_their_first_sentences() -> None:
    queries, corpus = precision.retrieval_set()
    assert len(queries) == 100 and len(corpus) > 500
    assert all(200 < len(text) < 1200 for text in corpus)
    assert all(any(text.startswith(query) for text in corpus) for query in queries)


def _with(result: dict, key: str, **figures: object) -> dict:
    result["paths"][key].update(figures)
    return result


def test_precision_targets_say_by_how_much_they_are_missed_and_where_they_apply() -> None:
    amd = _result("AMD EPYC, no AMX", {"worker": 100.0, "worker-bf16": 160.0, "onnxruntime": 90.0}, "2026-11-24")
    amd["flops"] = {"bulk": {"flops": 2e11, "texts": 100, "tokens": 2000, "mean_tokens": 20.0, "attention_span": 21.0, "flops_per_token": 1e8}}
    amd["roofline"] = {"rows": 1410, "torch_threads": 2, "repeats": 20, "gflops": {"fp32": 250.0, "bf16": 500.0}}
    quality = {"min_cosine": 0.9985, "mean_cosine": 0.9999, "same_top_k_set": 97, "same_top_k_order": 90, "queries": 100, "corpus": 739}
    _with(amd, "worker-bf16", precision="bf16", quality=quality)
    report.add_efficiency(amd)
    assert amd["paths"]["worker"]["fp32_roofline_fraction"]["bulk"] == pytest.approx(0.8)  # 100/s * 2 GFLOP / 250
    assert amd["paths"]["worker-bf16"]["own_roofline_fraction"]["bulk"] == pytest.approx(0.64)  # 320 / 500
    checks = {check["target"].split(" (")[0]: check for check in report.targets(amd)}

    assert checks["standalone worker >= 0.80 of the fp32 roofline"]["met"] is True
    on_amd = checks["bf16 worker >= 3x the fp32 worker on an AMX machine"]
    assert (on_amd["measured"], on_amd["met"]) == (1.6, None) and "AMX machines" in on_amd["missed_by"]
    cosine = checks["bf16 worker: cosine to fp32 >= 0.999 on every bulk text"]
    assert (cosine["met"], cosine["shown"], cosine["missed_by"]) == (False, "0.99850", "0.00050")
    neighbours = checks["bf16 worker: the same top-10 neighbours as fp32"]
    assert (neighbours["met"], neighbours["missed_by"]) == (False, "3 queries")
    assert checks["standalone worker ahead of ONNX Runtime, fp32"]["met"] is True
    assert checks["int8 worker ahead of ONNX Runtime, int8"]["missed_by"] == "not measured in this run"

    intel = _result("Intel Xeon, AMX", {"worker": 100.0, "worker-bf16": 250.0}, "2026-11-24")
    intel["machine"]["isa"] = ["avx512f", "amx_tile", "amx_bf16"]
    missed = {check["target"].split(" (")[0]: check for check in report.targets(intel)}["bf16 worker >= 3x the fp32 worker on an AMX machine"]
    assert (missed["met"], missed["missed_by"]) == (False, "0.50x")
    table = report.table(_with(amd, "worker-bf16", runs_in="m computes in bfloat16 on this CPU") | {"targets": report.targets(amd)})
    assert "| worker-bf16 | 1.60x | m computes in bfloat16 on this CPU | 0.99850 |" in table
    assert "97 of 100" in table


def test_profiled_ops_fall_in_the_category_that_does_their_work() -> None:
    from profile_cpu import categorize

    expected = {
        "mkldnn::_linear_pointwise": "Linear (matmul)",
        "aten::addmm": "Linear (matmul)",
        "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
        "aten::bmm": "attention",
        "aten::native_layer_norm": "layer norm",
        "aten::gelu": "GELU",
        "aten::index_select": "real-token gather / scatter",
        "aten::nonzero": "real-token gather / scatter",
        "aten::embedding": "embeddings",
        "aten::add": "elementwise, copies and allocation",
        "aten::to": "elementwise, copies and allocation",
        "aten::transpose": "views (no arithmetic)",
        "aten::t": "views (no arithmetic)",
        "aten::item": "other",
    }
    assert {op: categorize(op) for op in expected} == expected
