"""Checkpoints in the layouts real models ship in, each a tiny random replica served by one real worker and
compared with the reference library run in-process: ColBERT as PyLate, sentence-transformers'
MultiVectorEncoder and Stanford ColBERT save it (against MultiVectorEncoder, which reads all three); SigLIP
with its SentencePiece tokenizer (against transformers' SiglipModel); doc-only sparse models as OpenSearch and
sentence-transformers save them (against SparseEncoder with its SparseStaticEmbedding query side). And what an
encode that names no output types gets from a sparse-only or multivector-only model."""

from __future__ import annotations

import asyncio
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from tiny_layouts import (
    build_multi_vector_encoder,
    build_opensearch_sparse,
    build_pylate_colbert,
    build_router_sparse,
    build_sentencepiece_siglip,
    build_stanford_colbert,
    minilm_tokenizer,
    opensearch_sparse_encoder,
)
from tiny_models import write_config
from worker_process import Services, WorkerProcess, inference_stub

# 300 different words: where a length limit cuts shows in which tokens are left.
DIFFERENT_WORDS = " ".join(sorted(word for word in minilm_tokenizer().get_vocab() if word.isalpha() and len(word) > 4)[1000:1300])
TEXTS = [
    "What is late interaction?",
    "ColBERT keeps one vector per token, and scores with MaxSim: the sum, over query tokens, of the best match.",
    "a",
    DIFFERENT_WORDS,  # far past every length limit: truncated, not rejected
    " ".join(["overlong"] * 300) + ", with punctuation!",
]
# Doc-only sparse queries keep every token of their text with its weight, as SparseStaticEmbedding does: [UNK] (an
# emoji, a character the vocabulary lacks) and special tokens written in the text alike.
SPARSE_TEXTS = [*TEXTS, "I love 🍕 pizza 🍕 and ☃", "🚀", "[CLS] what is [SEP] late interaction [UNK] [MASK]", "ünïcödé 文字 interaction"]
# ColBERT model id -> (query length, document length) its directory states.
COLBERT = {"test/colbert-pylate": (12, 20), "test/colbert-st": (10, 24), "test/colbert-stanford": (11, 22)}
SIGLIP = "test/siglip-sentencepiece"
# The same weights with a tokenizer that pads on the left, as Gemma's (SigLIP 2's tokenizer) does.
SIGLIP_LEFT = "test/siglip-sentencepiece-left-padded"
OPENSEARCH = "test/sparse-opensearch"
SPARSE_ROUTER = "test/sparse-router"
SPARSE_BODY = "tasks: [encode]\noutput_types: [sparse]\nprofiles:\n  default:\n    adapter: splade\n"
COLBERT_BODY = "tasks: [encode, score]\noutput_types: [multivector]\nprofiles:\n  default:\n    adapter: colbert\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Model id -> directory, built once for the module."""
    root = tmp_path_factory.mktemp("layouts")
    lengths = {model_id: dict(zip(("query_length", "document_length"), pair)) for model_id, pair in COLBERT.items()}
    pylate = build_pylate_colbert(root / "colbert-pylate", **lengths["test/colbert-pylate"])
    return {
        "test/colbert-pylate": pylate,
        "test/colbert-st": build_multi_vector_encoder(pylate, root / "colbert-st", **lengths["test/colbert-st"]),
        "test/colbert-stanford": build_stanford_colbert(root / "colbert-stanford", **lengths["test/colbert-stanford"]),
        SIGLIP: (siglip := build_sentencepiece_siglip(root / "siglip")),
        SIGLIP_LEFT: left_padded(siglip, root / "siglip-left"),
        OPENSEARCH: (opensearch := build_opensearch_sparse(root / "sparse-opensearch")),
        SPARSE_ROUTER: build_router_sparse(opensearch, root / "sparse-router"),
    }


def left_padded(siglip: Path, directory: Path) -> Path:
    """A copy of the SigLIP replica whose tokenizer pads on the left."""
    shutil.copytree(siglip, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**config, "padding_side": "left"}))
    return directory


@pytest.fixture(scope="module")
def layouts_worker(services: Services, tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> WorkerProcess:
    configs = tmp_path_factory.mktemp("layout-configs")
    for model_id in COLBERT:
        write_config(configs, model_id, f"path: {models[model_id]}\n{COLBERT_BODY}")
    # Listed after multivector, the MUVERA dense output is there when asked for, not the default.
    write_config(
        configs, "test/colbert-muvera", f"path: {models['test/colbert-pylate']}\n{COLBERT_BODY.replace('[multivector]', '[multivector, dense]')}"
    )
    for model_id in (SIGLIP, SIGLIP_LEFT):
        write_config(
            configs, model_id, f"path: {models[model_id]}\ninputs: [text, image]\ntasks: [encode, score]\nprofiles:\n  default:\n    adapter: clip\n"
        )
    for model_id in (OPENSEARCH, SPARSE_ROUTER):
        write_config(configs, model_id, f"path: {models[model_id]}\n{SPARSE_BODY}")
    return services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ",".join([*models, "test/colbert-muvera"])}, name="layout-worker")


@pytest.fixture(scope="module")
def layouts_stub(layouts_worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with inference_stub(layouts_worker) as stub:
        yield stub


def encode(stub, model: str, texts: list[str], **fields) -> list[types_pb2.EncodeResult]:
    request = inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(id=str(i), text=text) for i, text in enumerate(texts)], **fields)
    return list(stub.Encode(request, timeout=120).results)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# --- ColBERT ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", list(COLBERT))
@pytest.mark.parametrize("is_query", [False, True], ids=["documents", "queries"])
def test_colbert_layouts_match_multi_vector_encoder(layouts_stub, models: dict[str, Path], model_id: str, is_query: bool) -> None:
    from sentence_transformers import MultiVectorEncoder

    reference = MultiVectorEncoder(str(models[model_id]), device="cpu")
    expected = (reference.encode_query if is_query else reference.encode_document)(TEXTS, convert_to_numpy=True)
    results = encode(layouts_stub, model_id, TEXTS, output_types=["multivector"], is_query=is_query)
    for result, vectors in zip(results, expected, strict=True):
        served = from_tensor(result.multivector)
        assert served.shape == vectors.shape, result.id
        assert row_cosines(served, vectors).min() >= 0.9999, result.id
    # The overlong texts are cut to the checkpoint's own length, marker included (their first tokens are words).
    query_length, document_length = COLBERT[model_id]
    assert [from_tensor(result.multivector).shape[0] for result in results[-2:]] == [query_length if is_query else document_length] * 2


# --- SigLIP with its SentencePiece tokenizer ----------------------------------------------------------


def png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_siglip_with_sentencepiece_tokenizer_matches_siglip_model(layouts_stub, models: dict[str, Path]) -> None:
    from transformers import AutoImageProcessor, AutoTokenizer, SiglipModel

    directory = models[SIGLIP]
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert type(tokenizer).__name__ == "SiglipTokenizer" and not tokenizer.is_fast
    model = SiglipModel.from_pretrained(directory).eval()
    processor = AutoImageProcessor.from_pretrained(directory, backend="pil")
    images = [png(seed) for seed in range(2)]
    with torch.inference_mode():
        text_inputs = tokenizer(TEXTS, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
        texts = model.get_text_features(input_ids=text_inputs["input_ids"]).pooler_output.numpy()
        pixels = processor(images=[Image.open(io.BytesIO(data)) for data in images], return_tensors="pt")["pixel_values"]
        pictures = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    items = [types_pb2.Item(id=f"t{i}", text=text) for i, text in enumerate(TEXTS)]
    items += [types_pb2.Item(id=f"i{i}", images=[types_pb2.Image(data=data)]) for i, data in enumerate(images)]
    response = layouts_stub.Encode(inference_pb2.EncodeRequest(model=SIGLIP, items=items), timeout=120)
    served = np.stack([from_tensor(result.dense) for result in response.results])
    assert row_cosines(served, np.concatenate([texts, pictures])).min() >= 0.9999
    # Punctuation and case are normalized away by SigLIP's tokenizer, as by the reference.
    again = encode(layouts_stub, SIGLIP, ["WHAT is late interaction"])
    np.testing.assert_allclose(from_tensor(again[0].dense), served[0], atol=1e-6)


@pytest.mark.parametrize("model_id", [SIGLIP, SIGLIP_LEFT])
def test_siglip_text_is_max_length_padded_on_the_tokenizers_side_without_a_mask(
    layouts_stub, models: dict[str, Path], model_id: str
) -> None:
    """SigLIP was trained on text padded to its maximum length with no attention mask (big_vision's text encoder takes
    none and reads the last position): served text embeddings equal get_text_features of the ids
    tokenizer(padding="max_length") gives, on whichever side it pads, without the mask it returns beside them.
    The processor's path, which now passes that mask, reads another last position: it differs."""
    from transformers import AutoTokenizer, SiglipModel

    tokenizer = AutoTokenizer.from_pretrained(models[model_id])
    assert tokenizer.padding_side == ("left" if model_id == SIGLIP_LEFT else "right")
    model = SiglipModel.from_pretrained(models[model_id]).eval()
    texts = [text for text in TEXTS if len(text) < 200] + ["ünïcödé 文字 🚀", ""]
    with torch.inference_mode():
        inputs = tokenizer(texts, padding="max_length", truncation=True, max_length=64, return_tensors="pt")
        expected = model.get_text_features(input_ids=inputs["input_ids"]).pooler_output.numpy()
        masked = model.get_text_features(**inputs).pooler_output.numpy()
    served = np.stack([from_tensor(result.dense) for result in encode(layouts_stub, model_id, texts)])
    assert row_cosines(served, expected).min() >= 0.9999
    assert row_cosines(served, masked).min() < 0.999


# --- doc-only sparse models ---------------------------------------------------------------------------


@pytest.mark.parametrize("model_id", [OPENSEARCH, SPARSE_ROUTER])
@pytest.mark.parametrize("is_query", [False, True], ids=["documents", "queries"])
def test_doc_only_sparse_matches_sparse_encoder(layouts_stub, models: dict[str, Path], model_id: str, is_query: bool) -> None:
    from sentence_transformers import SparseEncoder

    if model_id == OPENSEARCH:  # no sentence-transformers files: the reference is built from its modules (v2: relu)
        reference = opensearch_sparse_encoder(models[model_id], activation="relu")
    else:
        reference = SparseEncoder(str(models[model_id]), device="cpu")
    expected = (reference.encode_query if is_query else reference.encode_document)(SPARSE_TEXTS).to_dense().numpy()
    results = encode(layouts_stub, model_id, SPARSE_TEXTS, output_types=["sparse"], is_query=is_query)
    for result, row in zip(results, expected, strict=True):
        sparse = result.sparse
        assert sparse.dims == row.shape[0]
        assert list(sparse.indices) == list(np.flatnonzero(row)), result.id
        np.testing.assert_allclose(list(sparse.values), row[list(sparse.indices)], atol=1e-4)
    if is_query:  # static weights: a query's weights are its tokens' idf, whatever their context
        word = encode(layouts_stub, model_id, ["interaction"], output_types=["sparse"], is_query=True)[0].sparse
        assert set(word.indices) <= set(results[0].sparse.indices)
        assert dict(zip(word.indices, word.values)).items() <= dict(zip(results[0].sparse.indices, results[0].sparse.values)).items()


# --- the default output of an encode that names none ---------------------------------------------------


@pytest.mark.parametrize(
    ("model_id", "output"),
    [(OPENSEARCH, "sparse"), ("test/colbert-pylate", "multivector"), ("test/colbert-muvera", "multivector"), (SIGLIP, "dense")],
)
def test_encode_without_output_types_returns_the_models_own_output(layouts_worker, layouts_stub, model_id: str, output: str) -> None:
    from sie_client import AsyncSIEClient, Item, SIEClient

    explicit = encode(layouts_stub, model_id, TEXTS[:2], output_types=[output])
    assert all(result.HasField(output) for result in explicit)
    default = encode(layouts_stub, model_id, TEXTS[:2])  # gRPC (and grpcurl / HTTP) callers: no output_types
    assert default == explicit
    for other in {"dense", "sparse", "multivector"} - {output}:
        assert not any(result.HasField(other) for result in default)

    def fields(result) -> object:
        value = result[output]
        return (list(value["indices"]), list(value["values"])) if output == "sparse" else value.tolist()

    with SIEClient(layouts_worker.address) as client:
        synchronous = client.encode(model_id, [Item(text=text) for text in TEXTS[:2]])

    async def asynchronous() -> list:
        client = AsyncSIEClient(layouts_worker.address)
        try:
            return await client.encode(model_id, [Item(text=text) for text in TEXTS[:2]])
        finally:
            await client.close()

    for results in (synchronous, asyncio.run(asynchronous())):
        assert [fields(result) for result in results] == [fields(result) for result in synchronous]
        assert all(set(result) & {"dense", "sparse", "multivector"} == {output} for result in results)
    if output == "sparse":
        assert fields(synchronous[0]) == (list(explicit[0].sparse.indices), list(explicit[0].sparse.values))
