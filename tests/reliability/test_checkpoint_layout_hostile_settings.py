"""Adversarial checkpoint directories in the layouts issue 21 reads (ColBERT PyLate / Stanford, doc-only sparse),
each a tiny replica with one setting a download could carry made hostile, served by one real worker: a setting
that cannot be computed fails the model's load (FAILED_PRECONDITION / MODEL_LOAD_FAILED, naming it), never a
request's INTERNAL; a setting that can be read is read within the model's own bounds."""

from __future__ import annotations

import json
import os
import random
import shutil
import string
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import BertForMaskedLM

from grpc_helpers import call_until_loaded, error_reason
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from tiny_layouts import (
    HIDDEN,
    build_opensearch_sparse,
    build_pylate_colbert,
    build_router_sparse,
    build_sentencepiece_siglip,
    build_stanford_colbert,
    tiny_bert_config,
)
from tiny_models import write_config
from worker_process import Services, WorkerProcess

DOCUMENT_LENGTH = 20
COLBERT_BODY = "tasks: [encode, score]\noutput_types: [multivector]\nprofiles:\n  default:\n    adapter: colbert\n"
SPARSE_BODY = "tasks: [encode]\noutput_types: [sparse]\nprofiles:\n  default:\n    adapter: splade\n"
SHORT_VOCAB = 20_000
# The worker's answer size limit: 256 KiB, so that a few hundred ColBERT documents exceed it.
SEND_LIMIT = 256 * 1024
SIGLIP = "test/siglip-sentencepiece"
# Worker CPU seconds allowed for a request of 7 texts of 2 MiB without a space on SigLIP (read whole, ~19 s or more).
SIGLIP_CPU_BOUND_S = 3
# A query length far past the model's positions, as a config_sentence_transformers.json / artifact.metadata may say.
HUGE_QUERY_LENGTH = 100_000


class RunsCode:
    """Pickled as a call that writes `marker`: loading it runs code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pickled code ran"))


def _edit_json(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def _copy(source: Path, directory: Path) -> Path:
    shutil.copytree(source, directory)
    return directory


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """Model id -> (directory, config body), every hostile variant built once from three replicas."""
    root = tmp_path_factory.mktemp("hostile-layouts")
    pylate = build_pylate_colbert(root / "pylate", query_length=12, document_length=DOCUMENT_LENGTH)
    stanford = build_stanford_colbert(root / "stanford", query_length=11, document_length=DOCUMENT_LENGTH)
    opensearch = build_opensearch_sparse(root / "opensearch")
    router = build_router_sparse(opensearch, root / "router")
    built: dict[str, tuple[Path, str]] = {}

    def colbert(name: str, source: Path) -> Path:
        built[f"test/{name}"] = (directory := _copy(source, root / name), COLBERT_BODY)
        return directory

    def sparse(name: str, source: Path) -> Path:
        built[f"test/{name}"] = (directory := _copy(source, root / name), SPARSE_BODY)
        return directory

    _edit_json(colbert("pylate-huge-query", pylate) / "config_sentence_transformers.json", query_length=HUGE_QUERY_LENGTH)
    _edit_json(colbert("stanford-huge-query", stanford) / "artifact.metadata", query_maxlen=HUGE_QUERY_LENGTH)
    _edit_json(colbert("pylate-text-query-length", pylate) / "config_sentence_transformers.json", query_length="32")
    _edit_json(colbert("pylate-negative-query-length", pylate) / "config_sentence_transformers.json", query_length=-5)
    _edit_json(colbert("pylate-numeric-skiplist", pylate) / "config_sentence_transformers.json", skiplist_words=[1, 2])
    _edit_json(colbert("stanford-numeric-marker", stanford) / "artifact.metadata", query_token_id=1)
    # Module folders that modules.json names outside the model directory (and outside the weight root).
    outside = shutil.copytree(pylate / "1_Dense", tmp_path_factory.mktemp("outside-the-weight-root") / "1_Dense")
    modules = json.loads((pylate / "modules.json").read_text())
    modules[1]["path"] = str(outside)
    (colbert("pylate-dense-outside", pylate) / "modules.json").write_text(json.dumps(modules))
    # A projection whose input width is not the encoder's (a config claiming other dims).
    wide = colbert("pylate-wrong-projection", pylate) / "1_Dense" / "model.safetensors"
    save_file({"linear.weight": torch.randn(16, HIDDEN + 8)}, str(wide))
    weights = torch.load(stanford / "pytorch_model.bin", weights_only=True)
    weights["linear.weight"] = torch.randn(16, HIDDEN // 2)
    torch.save(weights, colbert("stanford-wrong-projection", stanford) / "pytorch_model.bin")

    # A pytorch_model.bin whose pickle runs code when loaded without weights_only: it writes a marker file.
    weights = torch.load(stanford / "pytorch_model.bin", weights_only=True)
    weights["linear.weight"] = RunsCode(str(root / "pickled-code-ran"))
    torch.save(weights, colbert("stanford-pickled-code", stanford) / "pytorch_model.bin")

    vocabulary = json.loads((opensearch / "idf.json").read_text())
    # As JSON spells them: NaN, Infinity, 1e39 (Infinity as float32), a 401-digit integer, null, a string.
    for name, value in (
        ("nan", "NaN"),
        ("infinity", "Infinity"),
        ("float32-overflow", "1e39"),
        ("huge-integer", "1" + "0" * 400),
        ("null", "null"),
        ("text", '"high"'),
    ):
        idf = sparse(f"sparse-idf-{name}", opensearch) / "idf.json"
        idf.write_text(json.dumps(vocabulary)[:-1] + f', "interaction": {value}}}')
    (sparse("sparse-idf-list", opensearch) / "idf.json").write_text(json.dumps(list(vocabulary.values())))
    static = sparse("sparse-static-2d", router) / "query_0_SparseStaticEmbedding" / "model.safetensors"
    save_file({"weight": load_file(str(static))["weight"].reshape(-1, 2)}, str(static))
    static = sparse("sparse-static-float32-overflow", router) / "query_0_SparseStaticEmbedding" / "model.safetensors"
    save_file({"weight": load_file(str(static))["weight"].double().index_fill(0, torch.tensor([7]), 1e39)}, str(static))
    sparse("sparse-opensearch", opensearch)
    escape = sparse("sparse-router-escape", router) / "modules.json"
    escape.write_text(escape.read_text().replace('"path": ""', '"path": "../router"'))
    # The masked-LM's table has 20,000 rows, the tokenizer (and idf.json) 30,522 ids: "zebra" is 29145.
    short = sparse("sparse-short-vocab", opensearch)
    BertForMaskedLM(tiny_bert_config(SHORT_VOCAB)).save_pretrained(short)
    built[SIGLIP] = (
        build_sentencepiece_siglip(root / "siglip"),
        "inputs: [text, image]\ntasks: [encode]\nprofiles:\n  default:\n    adapter: clip\n",
    )
    return built


@pytest.fixture(scope="module")
def layouts_worker(services: Services, tmp_path_factory: pytest.TempPathFactory, models: dict[str, tuple[Path, str]]) -> WorkerProcess:
    configs = tmp_path_factory.mktemp("hostile-layout-configs")
    for model_id, (directory, body) in models.items():
        write_config(configs, model_id, f"path: {directory}\n{body}")
    roots = {str(directory.parent) for directory, _ in models.values()}
    settings = {"SIE_MODELS_DIR": str(configs), "SIE_MAX_SEND_MESSAGE_BYTES": str(SEND_LIMIT), "SIE_WEIGHT_ROOTS": ",".join(sorted(roots))}
    return services.worker(settings, name="hostile-layout-worker")


@pytest.fixture(scope="module")
def layouts_stub(layouts_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    options = [("grpc.max_send_message_length", 64 * 2**20)]
    with grpc.insecure_channel(layouts_worker.address, options=options) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def encode(stub, model: str, texts: list[str], **fields) -> list[types_pb2.EncodeResult]:
    request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(id=str(i), text=text) for i, text in enumerate(texts)], **fields)
    answer, _ = call_until_loaded(lambda: stub.Encode(request, timeout=120))
    return list(answer.results)


def refused_load(stub, model: str) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        encode(stub, model, ["what is late interaction"], is_query=True)
    assert (refused.value.code(), error_reason(refused.value)) == (grpc.StatusCode.FAILED_PRECONDITION, "MODEL_LOAD_FAILED"), refused.value
    return refused.value


# --- ColBERT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["test/pylate-huge-query", "test/stanford-huge-query"])
def test_a_query_length_past_the_positions_expands_queries_only_as_far_as_the_model_reads(layouts_stub, model: str) -> None:
    """A query is cut to the model's length limit, and expanded no further than that limit: a query length of
    100,000 neither fails every query nor builds 100,000 vectors per query."""
    for results in (encode(layouts_stub, model, ["what is late interaction", "a"], is_query=True), encode(layouts_stub, model, ["a"], is_query=True)):
        assert [from_tensor(result.multivector).shape for result in results] == [(DOCUMENT_LENGTH, 16)] * len(results)
        assert all(np.isfinite(from_tensor(result.multivector)).all() for result in results)


@pytest.mark.parametrize(
    ("model", "named"),
    [
        ("test/pylate-text-query-length", "query_length"),
        ("test/pylate-negative-query-length", "query_length"),
        ("test/pylate-numeric-skiplist", "skiplist_words"),
        ("test/stanford-numeric-marker", "marker"),
        ("test/pylate-dense-outside", "leads out of the model directory"),
        ("test/pylate-wrong-projection", "linear.weight"),
        ("test/stanford-wrong-projection", "linear.weight"),
    ],
)
def test_a_colbert_setting_that_cannot_be_computed_fails_the_load(layouts_stub, model: str, named: str) -> None:
    assert named in refused_load(layouts_stub, model).details()


def test_a_multivector_answer_over_the_send_limit_is_refused_before_the_forward_pass(layouts_stub) -> None:
    """300 documents of 20 vectors x 16 dims (384 KB as float32) for a 256 KiB limit: refused from the token count,
    as an estimate (before: every item ran, its vectors were held, then the measured answer was refused), whether
    the request names multivector or names nothing (a multivector-only model's default). What fits still runs."""
    texts = ["ColBERT keeps one vector per token and scores with MaxSim over every token " * 3] * 300
    for fields in ({"output_types": ["multivector"]}, {}):
        with pytest.raises(grpc.RpcError) as refused:
            encode(layouts_stub, "test/pylate-huge-query", texts, **fields)
        assert (refused.value.code(), error_reason(refused.value)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "RESPONSE_TOO_LARGE")
        assert "would take at least 384000 bytes" in refused.value.details()
    packed = encode(layouts_stub, "test/pylate-huge-query", texts, output_dtype="binary")
    assert [from_tensor(result.multivector).shape for result in packed[:1]] == [(DOCUMENT_LENGTH, 2)]
    assert len(encode(layouts_stub, "test/pylate-huge-query", texts[:150])) == 150


def test_a_stanford_checkpoint_whose_pickle_runs_code_fails_the_load_without_running_it(layouts_stub, models: dict[str, tuple[Path, str]]) -> None:
    """pytorch_model.bin is read with weights_only: a pickled call is refused, not run."""
    marker = models["test/stanford-pickled-code"][0].parent / "pickled-code-ran"
    assert "pytorch_model.bin" in refused_load(layouts_stub, "test/stanford-pickled-code").details()
    assert not marker.exists()


# --- doc-only sparse --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "test/sparse-idf-nan",
        "test/sparse-idf-infinity",
        "test/sparse-idf-float32-overflow",
        "test/sparse-idf-huge-integer",
        "test/sparse-idf-null",
        "test/sparse-idf-text",
        "test/sparse-idf-list",
        "test/sparse-static-2d",
        "test/sparse-static-float32-overflow",
    ],
)
def test_query_weights_that_are_not_one_finite_number_per_token_fail_the_load(layouts_stub, model: str) -> None:
    assert "weight" in refused_load(layouts_stub, model).details().lower()


def test_static_sparse_queries_of_special_tokens_or_thousands_of_words_stay_bounded(layouts_stub) -> None:
    from tiny_layouts import minilm_tokenizer

    words = [word for word in minilm_tokenizer().get_vocab() if word.isalpha()][:5000]
    results = encode(layouts_stub, "test/sparse-opensearch", ["[CLS] [SEP] [PAD] [MASK]", "", " \t\n ", " ".join(words)], is_query=True)
    # Special tokens written in the text are tokens of it, weighed by their idf as sentence-transformers weighs
    # them (tests/test_model_layouts.py::test_doc_only_sparse_matches_sparse_encoder); no text is no dimension.
    assert [len(result.sparse.indices) for result in results[:3]] == [4, 0, 0]
    # Read as far as the tokenizer's 128 positions (special tokens aside), whatever the text's length.
    assert 0 < len(results[3].sparse.indices) <= 128
    assert np.isfinite(list(results[3].sparse.values)).all()


# --- SigLIP's Python-only SentencePiece tokenizer ---------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def no_space_texts(size: int) -> list[str]:
    """Texts with no space to cut at: one word, random letters, words joined by tabs or commas, CJK."""
    rng = random.Random(0)
    runs = ["interaction", "".join(rng.choice(string.ascii_lowercase) for _ in range(4096)), "late\tmodel\t", "late,model,", "语言模型"]
    return [run * (size // len(run.encode())) for run in runs]


def test_siglip_texts_without_spaces_cost_what_the_model_reads(layouts_worker, layouts_stub, models: dict[str, tuple[Path, str]]) -> None:
    """Before: the whole text went through the Python tokenizer, seconds of CPU per 2 MiB item (53 s for one
    request of 7 while other callers waited on the GIL). Now a text with no space is cut inside its run."""
    from transformers import AutoTokenizer, SiglipModel

    directory = models[SIGLIP][0]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = SiglipModel.from_pretrained(directory).eval()
    texts = no_space_texts(64 * 1024)  # the reference reads them whole
    with torch.inference_mode():
        inputs = tokenizer(texts, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
        expected = model.get_text_features(input_ids=inputs["input_ids"]).pooler_output.numpy()
    served = np.stack([from_tensor(result.dense) for result in encode(layouts_stub, SIGLIP, texts)])
    cosines = (served * expected).sum(axis=1) / (np.linalg.norm(served, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosines.min() >= 0.9999

    large = (no_space_texts(2 * 2**20 - 16)[:2] * 4)[:7]  # one word, random letters: within the 2 MiB and 16 MiB bounds
    before = cpu_seconds(layouts_worker.pid)
    results = encode(layouts_stub, SIGLIP, large)
    assert len(results) == 7 and all(np.isfinite(from_tensor(result.dense)).all() for result in results)
    assert cpu_seconds(layouts_worker.pid) - before < SIGLIP_CPU_BOUND_S


def test_static_query_weights_for_tokens_past_the_models_vocabulary_stay_inside_its_dims(layouts_stub) -> None:
    """A token the masked-LM has no row for is no dimension of the answer: before, "zebra" (id 29145) came back as
    index 29145 of a 20,000-dimension sparse vector."""
    query = encode(layouts_stub, "test/sparse-short-vocab", ["zebra hello"], is_query=True)[0].sparse
    assert query.dims == SHORT_VOCAB
    assert len(query.indices) > 0 and max(query.indices) < SHORT_VOCAB


def test_a_router_path_out_of_the_model_directory_fails_the_load(layouts_stub) -> None:
    assert "leads out of the model directory" in refused_load(layouts_stub, "test/sparse-router-escape").details()
