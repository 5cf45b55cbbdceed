"""The catalog configs written by hand for reference ids that had none (issue 36): each shipped file, as it is but
for its weights (a `path` to a tiny random replica of its checkpoint's architecture and layout, built offline, in
place of `hf_id` / `revision`), served by one real worker and compared with its reference library in-process:

- answerdotai/ModernBERT-base (a bare ModernBERT: no sentence-transformers files) against `SentenceTransformer`;
- laion/CLIP-ViT-H-14 (a CLIPModel of 1,024-wide embeddings, 77 text positions) against `CLIPModel`;
- the SPLADE models (a bare BERT masked-LM; sentence-transformers' SparseEncoder layout over BERT and DistilBERT)
  against `SparseEncoder.encode_query` / `encode_document`;
- mxbai-edge-colbert (PyLate layout over ModernBERT, "[Q] " / "[D] " markers added to the vocabulary, queries not
  expanded) against `MultiVectorEncoder`;
- gliclass-large-v3.0 (a uni-encoder over DeBERTa-v2 with embedded class tokens) against gliclass's
  `ZeroShotClassificationPipeline`;
- donut-base-finetuned-rvlcdip against `generate()` and the model card's parse;
- microsoft/Florence-2-base, -large, -base-ft (served from florence-community's native weights) against
  `generate()` with the checkpoints' generation config (3 beams) and `post_process_generation`.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from google.protobuf import json_format
from PIL import Image

from grpc_helpers import call_until_loaded
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from tiny_document_readers import build_tiny_donut, build_tiny_florence2, donut_card_parse
from tiny_families import NLI_LABELS, NLI_MAX_LENGTH, NLI_TEXTS, build_tiny_gliclass
from tiny_layouts import build_bare_modernbert, build_pylate_colbert, build_sparse_encoder, minilm_tokenizer
from tiny_models import build_tiny_clip, build_tiny_head_model
from worker_process import Services, inference_stub

CATALOG = Path(__file__).resolve().parents[1] / "catalog" / "models"
MODERNBERT = "answerdotai/ModernBERT-base"
CLIP_H = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
SPARSE = {  # shipped id -> the replica of its checkpoint's layout
    "naver/splade-cocondenser-selfdistil": "splade-bare",
    "prithivida/Splade_PP_en_v2": "splade-bare",
    "rasyosef/splade-mini": "splade-st",
    "opensearch-project/opensearch-neural-sparse-encoding-v1": "splade-st",
    "opensearch-project/opensearch-neural-sparse-encoding-v2-distill": "splade-st-distilbert",
}
EDGE_COLBERT = "mixedbread-ai/mxbai-edge-colbert-v0-32m"
GLICLASS_V3 = "knowledgator/gliclass-large-v3.0"
RVLCDIP = "naver-clova-ix/donut-base-finetuned-rvlcdip"
FLORENCE = ["microsoft/Florence-2-base", "microsoft/Florence-2-large", "microsoft/Florence-2-base-ft"]
REPLICA_OF = {
    MODERNBERT: "modernbert",
    CLIP_H: "clip-h",
    **SPARSE,
    EDGE_COLBERT: "edge-colbert",
    GLICLASS_V3: "gliclass-deberta",
    RVLCDIP: "donut-rvlcdip",
    **dict.fromkeys(FLORENCE, "florence2"),
}
# mxbai-edge-colbert's config_sentence_transformers.json: queries of 48 tokens, not expanded; documents of 512.
EDGE_QUERY_LENGTH, EDGE_DOCUMENT_LENGTH = 48, 512
RVLCDIP_CLASSES = ("<letter/>", "<memo/>", "<invoice/>", "<form/>")
# Florence-2 checkpoints' generation_config.json.
FLORENCE_GENERATION = {"num_beams": 3, "no_repeat_ngram_size": 3, "early_stopping": True}
# 300 different words: where a length limit cuts shows in which tokens are left.
WORDS = sorted(word for word in minilm_tokenizer().get_vocab() if word.isalpha() and len(word) > 4)[1000:1600]
TEXTS = [
    "What is late interaction?",
    "SPLADE weighs every word of the vocabulary; ColBERT keeps one vector per token, and scores with MaxSim.",
    "a",
    " ".join(WORDS[:300]),
    "I love 🍕 pizza and ☃, ünïcödé 文字!",
]
# Past every model's limit but ModernBERT's 8,192 tokens: cut, never refused.
OVERLONG = " ".join(WORDS * 2)


def served_config(model_id: str, replica: Path, width: int | None) -> dict[str, Any]:
    """The shipped file of `model_id` with its weights read from `replica`; `dims` left out where the replica is
    narrower than the real model (`width`: the replica's, when it is the shipped width)."""
    config = yaml.safe_load((CATALOG / f"{model_id.replace('/', '__')}.yaml").read_text())
    assert config["id"] == model_id
    del config["hf_id"]
    config.pop("revision", None)
    if config.get("dims") != width:
        config.pop("dims", None)
    return {**config, "path": str(replica)}


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Replica name -> directory, built once."""
    root = tmp_path_factory.mktemp("catalog-replicas")
    return {
        "modernbert": build_bare_modernbert(root / "modernbert", positions=8192),
        "clip-h": build_tiny_clip(root / "clip-h", projection_dim=1024, max_length=77),
        "splade-bare": build_tiny_head_model(root / "splade-bare", "masked_lm"),
        "splade-st": build_sparse_encoder(root / "splade-st"),
        "splade-st-distilbert": build_sparse_encoder(root / "splade-st-distilbert", distilbert=True),
        "edge-colbert": build_pylate_colbert(
            root / "edge-colbert",
            query_length=EDGE_QUERY_LENGTH,
            document_length=EDGE_DOCUMENT_LENGTH,
            modernbert=True,
            markers=("[Q] ", "[D] "),
            query_expansion=False,
            lowercase=True,
        ),
        "gliclass-deberta": build_tiny_gliclass(root / "gliclass-deberta", deberta=True),
        "donut-rvlcdip": build_tiny_donut(
            root / "donut-rvlcdip", task="<s_rvlcdip>", extra_tokens=("<s_class>", "</s_class>", *RVLCDIP_CLASSES)
        ),
        "florence2": build_tiny_florence2(root / "florence2", generation=FLORENCE_GENERATION),
    }


@pytest.fixture(scope="module")
def catalog_stub(
    services: Services, replicas: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("catalog-configs")
    for model_id, replica in REPLICA_OF.items():
        config = served_config(model_id, replicas[replica], 1024 if replica == "clip-h" else None)
        (configs / f"{model_id.replace('/', '--')}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    worker = services.worker(
        {"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": ",".join(REPLICA_OF)}, name="catalog-configs"
    )
    with inference_stub(worker) as catalog_stub:
        listed = catalog_stub.ListModels(inference_pb2.ListModelsRequest())
        assert list(listed.config_problems) == []
        assert set(REPLICA_OF) <= {model.id for model in listed.models}
        yield catalog_stub


def encode(catalog_stub, model: str, texts: list[str], **fields: Any) -> list[types_pb2.EncodeResult]:
    request = inference_pb2.EncodeRequest(
        model=model, items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)], **fields
    )
    response, _ = call_until_loaded(lambda: catalog_stub.Encode(request, timeout=120))
    return list(response.results)


def extract(catalog_stub, model: str, items: list[types_pb2.Item], **fields: Any) -> inference_pb2.ExtractResponse:
    request = inference_pb2.ExtractRequest(model=model, items=items, **fields)
    response, _ = call_until_loaded(lambda: catalog_stub.Extract(request, timeout=120))
    return response


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def png(seed: int, size: tuple[int, int] = (56, 40)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


PAGES = [png(0), png(1, (40, 64))]


def page_items(texts: list[str | None] | None = None) -> list[types_pb2.Item]:
    texts = texts or [None] * len(PAGES)
    return [
        types_pb2.Item(id=str(row), images=[types_pb2.Image(data=data)], text=text)
        for row, (data, text) in enumerate(zip(PAGES, texts, strict=True))
    ]


# --- encoders -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("is_query", [False, True], ids=["documents", "queries"])
def test_modernbert_base_equals_sentence_transformer(catalog_stub, replicas: dict[str, Path], is_query: bool) -> None:
    """Mean pooling, not normalized (the norms agree too), as SentenceTransformer reads a bare directory."""
    from sentence_transformers import SentenceTransformer

    texts = [*TEXTS, OVERLONG]
    expected = SentenceTransformer(str(replicas["modernbert"]), device="cpu").encode(texts, convert_to_numpy=True)
    served = np.stack(
        [from_tensor(result.dense) for result in encode(catalog_stub, MODERNBERT, texts, is_query=is_query)]
    )
    assert served.shape == expected.shape
    assert row_cosines(served, expected).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), np.linalg.norm(expected, axis=1), rtol=1e-4)
    assert abs(np.linalg.norm(served[0]) - 1) > 0.01  # not normalized


def test_clip_vit_h_equals_clip_model(catalog_stub, replicas: dict[str, Path]) -> None:
    """Texts (cut at 77 tokens) and images, 1,024 wide (the config's dims, checked at load)."""
    from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel

    directory = replicas["clip-h"]
    model = CLIPModel.from_pretrained(directory).eval()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    processor = AutoImageProcessor.from_pretrained(directory, backend="pil")
    texts = [*TEXTS, OVERLONG]
    with torch.inference_mode():
        inputs = tokenizer(texts, padding=True, truncation=True, max_length=77, return_tensors="pt")
        text_features = model.get_text_features(**inputs).pooler_output.numpy()
        pixels = processor(images=[Image.open(io.BytesIO(data)) for data in PAGES], return_tensors="pt")["pixel_values"]
        image_features = model.get_image_features(pixel_values=pixels).pooler_output.numpy()
    items = [types_pb2.Item(id=f"t{i}", text=text) for i, text in enumerate(texts)] + page_items()
    response, _ = call_until_loaded(
        lambda: catalog_stub.Encode(inference_pb2.EncodeRequest(model=CLIP_H, items=items), timeout=120)
    )
    served = np.stack([from_tensor(result.dense) for result in response.results])
    assert served.shape == (len(texts) + len(PAGES), 1024)
    assert row_cosines(served, np.concatenate([text_features, image_features])).min() >= 0.9999


@pytest.mark.parametrize("model_id", list(SPARSE))
def test_splade_configs_equal_sparse_encoder(catalog_stub, replicas: dict[str, Path], model_id: str) -> None:
    """Queries and documents alike through the masked-LM: the same indices, weights within 1e-4 (documents past
    the 512-token limit cut there)."""
    from sentence_transformers import SparseEncoder

    reference = SparseEncoder(str(replicas[SPARSE[model_id]]), device="cpu")
    for is_query, texts in ((False, [*TEXTS, OVERLONG]), (True, TEXTS)):
        expected = (reference.encode_query if is_query else reference.encode_document)(texts).to_dense().numpy()
        results = encode(catalog_stub, model_id, texts, is_query=is_query)
        for result, row in zip(results, expected, strict=True):
            assert result.sparse.dims == row.shape[0]
            assert list(result.sparse.indices) == list(np.flatnonzero(row)), (is_query, result.id)
            np.testing.assert_allclose(list(result.sparse.values), row[list(result.sparse.indices)], atol=1e-4)
        assert min(len(result.sparse.indices) for result in results) > 10


@pytest.mark.parametrize("is_query", [False, True], ids=["documents", "queries"])
def test_mxbai_edge_colbert_equals_multi_vector_encoder(
    catalog_stub, replicas: dict[str, Path], is_query: bool
) -> None:
    """Every token vector (cosine >= 0.9999) and their counts: queries cut at 48 tokens and never padded with
    [MASK], documents cut at 512, punctuation dropped from documents."""
    from sentence_transformers import MultiVectorEncoder

    reference = MultiVectorEncoder(str(replicas["edge-colbert"]), device="cpu")
    texts = [*TEXTS, OVERLONG]
    expected = (reference.encode_query if is_query else reference.encode_document)(texts, convert_to_numpy=True)
    results = encode(catalog_stub, EDGE_COLBERT, texts, output_types=["multivector"], is_query=is_query)
    for result, vectors in zip(results, expected, strict=True):
        served = from_tensor(result.multivector)
        assert served.shape == vectors.shape, result.id
        assert row_cosines(served, vectors).min() >= 0.9999, result.id
    counts = [from_tensor(result.multivector).shape[0] for result in results]
    assert counts[-1] == (EDGE_QUERY_LENGTH if is_query else EDGE_DOCUMENT_LENGTH)
    assert counts[2] < 5  # "a": not expanded to the query length


# --- extractors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("classification_type", ["multi-label", "single-label"])
def test_gliclass_v3_equals_its_pipeline(catalog_stub, replicas: dict[str, Path], classification_type: str) -> None:
    from gliclass import GLiClassModel, ZeroShotClassificationPipeline
    from transformers import AutoTokenizer

    directory = replicas["gliclass-deberta"]
    pipeline = ZeroShotClassificationPipeline(
        GLiClassModel.from_pretrained(str(directory)),
        AutoTokenizer.from_pretrained(str(directory)),
        max_length=NLI_MAX_LENGTH,
        classification_type=classification_type,
        device="cpu",
        progress_bar=False,
    )
    expected = pipeline(NLI_TEXTS, NLI_LABELS, threshold=0.0)
    request = inference_pb2.ExtractRequest(
        model=GLICLASS_V3,
        items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(NLI_TEXTS)],
        labels=NLI_LABELS,
        threshold=0.0,
    )
    request.options.update({"classification_type": classification_type})
    response, _ = call_until_loaded(lambda: catalog_stub.Extract(request, timeout=120))
    for result, found in zip(response.results, expected, strict=True):
        best_first = sorted(found, key=lambda prediction: -prediction["score"])
        assert [c.label for c in result.classifications] == [p["label"] for p in best_first]
        np.testing.assert_allclose(
            [c.score for c in result.classifications], [p["score"] for p in best_first], atol=1e-4
        )
    if classification_type == "multi-label":  # every label back, scored apart: their order is the model's
        scores = [c.score for result in response.results for c in result.classifications]
        assert len(scores) == len(NLI_TEXTS) * len(NLI_LABELS) and max(scores) - min(scores) > 0.05


def test_donut_rvlcdip_answers_as_the_model_card_parses_them(catalog_stub, replicas: dict[str, Path]) -> None:
    from transformers import AutoProcessor, VisionEncoderDecoderModel

    directory = replicas["donut-rvlcdip"]
    processor = AutoProcessor.from_pretrained(directory)
    model = VisionEncoderDecoderModel.from_pretrained(directory).eval()
    served = [json_format.MessageToDict(result.data) for result in extract(catalog_stub, RVLCDIP, page_items()).results]
    prompt = processor.tokenizer("<s_rvlcdip>", add_special_tokens=False, return_tensors="pt").input_ids
    for data, encoded in zip(served, PAGES, strict=True):
        pixels = processor(images=Image.open(io.BytesIO(encoded)).convert("RGB"), return_tensors="pt").pixel_values
        with torch.inference_mode():
            ids = model.generate(
                pixel_values=pixels, decoder_input_ids=prompt, max_new_tokens=16, do_sample=False, num_beams=1
            )
        assert data == donut_card_parse(processor, ids[0].tolist())


@pytest.mark.parametrize(("model_id", "task"), [*((model_id, "<OCR>") for model_id in FLORENCE), (FLORENCE[0], "<OD>")])
def test_florence2_configs_equal_generate_with_the_checkpoints_beams(
    catalog_stub, replicas: dict[str, Path], model_id: str, task: str
) -> None:
    """Each config's default task (OCR, the request naming none) and a structured one, with the generation config's
    3 beams: the tokens of generate(), post-processed as the processor does."""
    from transformers import AutoProcessor, Florence2ForConditionalGeneration

    directory = replicas["florence2"]
    processor = AutoProcessor.from_pretrained(directory)
    model = Florence2ForConditionalGeneration.from_pretrained(directory).eval()
    assert model.generation_config.num_beams == 3
    options = {} if task == "<OCR>" else {"task": task}
    request = inference_pb2.ExtractRequest(model=model_id, items=page_items())
    request.options.update({**options, "max_new_tokens": 12})
    response, _ = call_until_loaded(lambda: catalog_stub.Extract(request, timeout=120))
    for result, encoded in zip(response.results, PAGES, strict=True):
        image = Image.open(io.BytesIO(encoded)).convert("RGB")
        with torch.inference_mode():
            ids = model.generate(
                **processor(text=task, images=image, return_tensors="pt"), max_new_tokens=12, do_sample=False
            )
        text = processor.batch_decode(ids, skip_special_tokens=False)[0]
        expected = processor.post_process_generation(text, task=task, image_size=image.size)[task]
        assert json_format.MessageToDict(result.data) == ({"text": expected} if isinstance(expected, str) else expected)
