"""The requests of the behaviour corpus (tools/behaviour_corpus.py): every output type, dtype, dims, LoRA, profile,
image, MUVERA, instruction, threshold and option the worker reads, and the refusals a caller can meet, for the
models of tools/corpus_models.py. Each case is one call: its method and its request message(s)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from google.protobuf import json_format, struct_pb2
from PIL import Image

from corpus_models import MINILM
from sie.v1 import inference_pb2, types_pb2, worker_pb2

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "Ada Lovelace worked with Charles Babbage in London on the Analytical Engine.",
    "a",
    " ".join(["search engines rank documents by relevance"] * 20),  # past every tiny model's length
]
QUERY = "which engines rank documents"
LABELS = ["person", "city", "machine"]
TOPICS = ["sports", "economy", "technology"]
DTYPES = ("float32", "float16", "int8", "uint8", "binary", "ubinary")


@dataclass(frozen=True)
class Case:
    """One call: `method` of sie.v1.Inference (or "Work", a stream of WorkRequests; "EncodeStream"), its request."""

    name: str
    method: str
    request: Any
    # Whether it goes over HTTP too (unary Encode, Score, Extract and CreateEmbeddings).
    http: bool = True


def picture(seed: int, size: tuple[int, int], format: str = "PNG") -> bytes:
    """A random picture of `size` (width, height): gradients plus noise, encoded in `format`."""
    rng = np.random.default_rng(seed)
    width, height = size
    ramp = np.linspace(0, 255, width)[None, :, None] * rng.random(3) + np.linspace(0, 255, height)[:, None, None] * (
        rng.random(3)
    )
    pixels = np.clip(ramp / 2 + rng.integers(0, 60, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=format)
    return buffer.getvalue()


PNG = picture(1, (70, 50))
JPEG = picture(2, (48, 40), "JPEG")
WIDE = picture(3, (140, 100))
GIF = picture(4, (20, 20), "GIF")


def items(*texts: str, images: tuple[bytes, ...] = ()) -> list[types_pb2.Item]:
    made = [types_pb2.Item(id=f"t{index}", text=text) for index, text in enumerate(texts)]
    made += [types_pb2.Item(id=f"i{index}", images=[types_pb2.Image(data=data)]) for index, data in enumerate(images)]
    return made


def options(**values: Any) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def encode(model: str, texts: list[str] | None = None, **fields: Any) -> inference_pb2.EncodeRequest:
    given = fields.pop("items", None)
    return inference_pb2.EncodeRequest(
        model=model, items=given if given is not None else items(*(texts or TEXTS)), **fields
    )


def score(
    model: str, query: str | types_pb2.Item = QUERY, texts: list[str] | None = None, **fields: Any
) -> inference_pb2.ScoreRequest:
    given = fields.pop("items", None)
    query_item = types_pb2.Item(text=query) if isinstance(query, str) else query
    return inference_pb2.ScoreRequest(
        model=model, query=query_item, items=given if given is not None else items(*(texts or TEXTS)), **fields
    )


def extract(model: str, texts: list[str] | None = None, **fields: Any) -> inference_pb2.ExtractRequest:
    given = fields.pop("items", None)
    return inference_pb2.ExtractRequest(
        model=model, items=given if given is not None else items(*(texts or TEXTS)), **fields
    )


def encode_cases() -> Iterator[Case]:
    for model in ("c/mean", "c/cls", "c/lasttoken-raw", "c/mean-no-prompt", "c/decoder", MINILM):
        yield Case(f"encode {model}", "Encode", encode(model))
        yield Case(f"encode {model} query", "Encode", encode(model, is_query=True))
        yield Case(f"encode {model} instruction", "Encode", encode(model, instruction="Represent the topic: "))
    for dtype in DTYPES:
        yield Case(f"encode dtype {dtype}", "Encode", encode("c/mean", output_dtype=dtype))
        yield Case(f"encode raw dtype {dtype}", "Encode", encode("c/lasttoken-raw", output_dtype=dtype, dims=12))
    yield Case("encode dims 8", "Encode", encode("c/mean", dims=8))
    yield Case("encode dims raw", "Encode", encode("c/lasttoken-raw", dims=8))
    yield Case("encode instructed profile", "Encode", encode("c/mean", profile="instructed", instruction="find it"))
    yield Case("encode params", "Encode", encode("c/mean", params=inference_pb2.EncodeParams(is_query=True, dims=16)))
    yield Case("encode options alias", "Encode", encode("c/mean", options=options(is_query=True, instruction="x: ")))
    yield Case("encode ignored option", "Encode", encode("c/mean", options=options(dimz=3)))
    yield Case("encode options.dims", "Encode", encode("c/mean", options=options(dims=3, output_dtype="int8")))
    for lora in ("", "alpha", "beta"):
        yield Case(f"encode lora {lora or 'none'}", "Encode", encode("c/mean-lora", lora=lora))
    yield Case("encode lora option", "Encode", encode("c/mean-lora", options=options(lora="beta")))
    yield Case("encode splade", "Encode", encode("c/splade"))
    yield Case("encode splade query", "Encode", encode("c/splade", is_query=True, instruction="q: "))
    yield Case("encode colbert multivector", "Encode", encode("c/colbert"))
    yield Case("encode colbert query", "Encode", encode("c/colbert", is_query=True, output_types=["multivector"]))
    yield Case("encode colbert muvera", "Encode", encode("c/colbert", output_types=["dense"]))
    yield Case("encode colbert muvera query", "Encode", encode("c/colbert", output_types=["dense"], is_query=True))
    yield Case("encode colbert both", "Encode", encode("c/colbert", output_types=["dense", "multivector"], dims=40))
    yield Case(
        "encode colbert muvera options",
        "Encode",
        encode("c/colbert", output_types=["dense"], options=options(muvera={"k_sim": 2, "repetitions": 2})),
    )
    yield Case(
        "encode colbert binary", "Encode", encode("c/colbert", output_types=["multivector"], output_dtype="binary")
    )
    for outputs in (["dense"], ["sparse"], ["multivector"], ["dense", "sparse", "multivector"]):
        yield Case(f"encode bge-m3 {'+'.join(outputs)}", "Encode", encode("c/bge-m3", output_types=outputs))
    yield Case("encode bge-m3 query lora", "Encode", encode("c/bge-m3", is_query=True, lora="tuned"))
    yield Case("encode bge-m3 prompted", "Encode", encode("c/bge-m3", profile="prompted", is_query=True))
    yield Case("encode bge-m3 instruction", "Encode", encode("c/bge-m3", instruction="Represent: "))
    for model in ("c/clip", "c/siglip"):
        yield Case(f"encode {model} texts", "Encode", encode(model))
        yield Case(f"encode {model} images", "Encode", encode(model, items=items(images=(PNG, JPEG, WIDE))))
        yield Case(f"encode {model} mixed", "Encode", encode(model, items=items("a cat", "a dog", images=(PNG, JPEG))))
    yield Case("encode clip raw", "Encode", encode("c/clip", items=items("a cat", images=(PNG,)), profile="raw"))
    yield Case("encode clip instruction", "Encode", encode("c/clip", instruction="a photo of "))
    yield Case(
        "encode clip format hint",
        "Encode",
        encode("c/clip", items=[types_pb2.Item(images=[types_pb2.Image(data=JPEG, format="image/jpeg")])]),
    )
    for model in ("c/colpali", "c/colqwen2"):
        yield Case(f"encode {model} texts", "Encode", encode(model, texts=["what is the revenue?", "a chart"]))
        yield Case(f"encode {model} images", "Encode", encode(model, items=items(images=(PNG, WIDE))))
    yield Case(
        "encode colpali muvera",
        "Encode",
        encode("c/colpali", items=items("a chart", images=(PNG,)), output_types=["dense"]),
    )
    embeddings = json_format.ParseDict({"model": MINILM, "input": TEXTS[:2]}, inference_pb2.CreateEmbeddingsRequest())
    yield Case("embeddings minilm", "CreateEmbeddings", embeddings)


def score_cases() -> Iterator[Case]:
    for model in ("c/reranker", "c/qwen3-reranker", "c/mxbai-reranker", "c/colbert", "c/bge-m3"):
        yield Case(f"score {model}", "Score", score(model))
        yield Case(f"score {model} top_k", "Score", score(model, top_k=2))
        yield Case(f"score {model} instruction", "Score", score(model, instruction="Judge relevance: "))
    for mode in ("dense", "sparse", "multivector", "colbert", "hybrid"):
        yield Case(f"score bge-m3 {mode}", "Score", score("c/bge-m3", options=options(score_mode=mode)))
    yield Case(
        "score bge-m3 weights",
        "Score",
        score(
            "c/bge-m3", options=options(score_mode="hybrid", score_weights={"dense": 1, "sparse": 0.5, "colbert": 2})
        ),
    )
    yield Case("score bge-m3 lexical profile", "Score", score("c/bge-m3", profile="lexical"))
    yield Case("score clip text over images", "Score", score("c/clip", "a cat", items=items(images=(PNG, JPEG, WIDE))))
    image_query = types_pb2.Item(images=[types_pb2.Image(data=PNG)])
    yield Case("score clip image over texts", "Score", score("c/clip", query=image_query, texts=["a cat", "a dog"]))
    yield Case("score clip instruction", "Score", score("c/clip", "cat", texts=["x", "y"], instruction="a photo of "))
    yield Case(
        "score colpali", "Score", score("c/colpali", "the revenue", items=items("page text", images=(PNG, WIDE)))
    )
    yield Case("score colqwen2", "Score", score("c/colqwen2", "the revenue", items=items(images=(PNG, WIDE))))


def extract_cases() -> Iterator[Case]:
    yield Case("extract ner", "Extract", extract("c/ner"))
    yield Case("extract ner threshold", "Extract", extract("c/ner", threshold=0.3))
    yield Case("extract ner labels", "Extract", extract("c/ner", labels=LABELS))
    yield Case("extract nli", "Extract", extract("c/nli", labels=TOPICS))
    yield Case("extract nli one label", "Extract", extract("c/nli", labels=["sports"]))
    yield Case(
        "extract nli multi",
        "Extract",
        extract("c/nli", labels=TOPICS, options=options(multi_label=True), threshold=0.4),
    )
    yield Case(
        "extract nli template",
        "Extract",
        extract("c/nli", labels=TOPICS, options=options(hypothesis_template="About {}.")),
    )
    yield Case("extract nli topic profile", "Extract", extract("c/nli", labels=TOPICS, profile="topic"))
    yield Case("extract gliclass", "Extract", extract("c/gliclass", labels=TOPICS))
    yield Case("extract gliclass single", "Extract", extract("c/gliclass", labels=TOPICS, profile="single"))
    yield Case(
        "extract gliclass option",
        "Extract",
        extract("c/gliclass", labels=TOPICS, options=options(classification_type="single-label")),
    )
    yield Case("extract gliner", "Extract", extract("c/gliner", labels=LABELS, threshold=0.2))
    yield Case("extract gliner merged", "Extract", extract("c/gliner", labels=LABELS, threshold=0.1, profile="merged"))
    text = TEXTS[1]
    spans = [
        {"start": text.index(name), "end": text.index(name) + len(name), "label": label}
        for name, label in (("Ada Lovelace", "person"), ("Charles Babbage", "person"), ("London", "city"))
    ]
    relations = ["works with", "lives in"]
    yield Case(
        "extract glirel spans",
        "Extract",
        extract("c/glirel", [text], labels=relations, threshold=0.0, options=options(entities=spans, top_k=1)),
    )
    yield Case(
        "extract glirel ner", "Extract", extract("c/glirel", [text], labels=relations, threshold=0.0, profile="ner")
    )
    detect = items(images=(PNG, WIDE, JPEG))
    yield Case(
        "extract grounding-dino",
        "Extract",
        extract("c/grounding-dino", items=detect, labels=["a cat", "dog"], threshold=0.0),
    )
    yield Case(
        "extract grounding-dino options",
        "Extract",
        extract(
            "c/grounding-dino",
            items=detect,
            labels=["a cat"],
            threshold=0.0,
            options=options(max_objects=2, text_threshold=0.1),
        ),
    )
    yield Case(
        "extract grounding-dino strict",
        "Extract",
        extract("c/grounding-dino", items=detect, labels=["dog"], profile="strict"),
    )
    yield Case("extract owlv2", "Extract", extract("c/owlv2", items=detect, labels=["a cat", "dog"], threshold=0.0))
    pages = items(images=(PNG, WIDE))
    yield Case("extract florence2", "Extract", extract("c/florence2", items=pages))
    yield Case(
        "extract florence2 task",
        "Extract",
        extract("c/florence2", items=pages, options=options(task="<CAPTION>", max_new_tokens=4)),
    )
    question = [types_pb2.Item(text="what is the total?", images=[types_pb2.Image(data=PNG)])]
    yield Case("extract florence2 question", "Extract", extract("c/florence2", items=question))
    yield Case("extract donut", "Extract", extract("c/donut", items=pages))
    yield Case("extract donut question", "Extract", extract("c/donut", items=question))


def refusal_cases() -> Iterator[Case]:
    yield Case("refuse model not found", "Encode", encode("c/none"))
    yield Case("refuse missing model", "Encode", encode(""))
    yield Case("refuse profile not found", "Encode", encode("c/mean", profile="nope"))
    yield Case("refuse lora not found", "Encode", encode("c/mean-lora", lora="gamma"))
    yield Case("refuse operation", "Score", score("c/mean"))
    yield Case("refuse image input", "Encode", encode("c/mean", items=items(images=(PNG,))))
    yield Case("refuse output not produced", "Encode", encode("c/mean", output_types=["sparse"]))
    yield Case("refuse unknown output", "Encode", encode("c/mean", output_types=["sparse2"]))
    yield Case("refuse dtype", "Encode", encode("c/mean", output_dtype="float64"))
    yield Case("refuse dims 0", "Encode", encode("c/mean", dims=0))
    yield Case("refuse dims too large", "Encode", encode("c/mean", dims=4096))
    yield Case("refuse no items", "Encode", encode("c/mean", items=[]))
    yield Case("refuse item without text", "Encode", encode("c/mean", items=[types_pb2.Item(id="empty")]))
    yield Case("refuse too many items", "Encode", encode("c/mean", ["x"] * 65))
    yield Case("refuse text too long", "Encode", encode("c/mean", ["y" * 5000]))
    yield Case("refuse name too long", "Encode", encode("c/mean", lora="l" * 300))
    yield Case("refuse instruction too long", "Encode", encode("c/mean", instruction="i" * 2000))
    deep: dict[str, Any] = {}
    for _ in range(12):
        deep = {"a": deep}
    yield Case("refuse options too deep", "Encode", encode("c/mean", options=options(deep=deep)))
    yield Case("refuse options too large", "Encode", encode("c/mean", options=options(big="b" * 5000)))
    yield Case(
        "refuse conflicting options",
        "Encode",
        encode("c/mean", is_query=True, options=options(is_query=False, lora="x")),
    )
    yield Case(
        "refuse conflicting params", "Encode", encode("c/mean", dims=8, params=inference_pb2.EncodeParams(dims=16))
    )
    yield Case("refuse bad option alias", "Encode", encode("c/mean", options=options(is_query="yes")))
    yield Case("refuse missing query", "Score", score("c/reranker", query=types_pb2.Item(id="q")))
    yield Case("refuse top_k", "Score", score("c/reranker", top_k=-1))
    yield Case("refuse too many labels", "Extract", extract("c/nli", labels=[f"l{index}" for index in range(20)]))
    yield Case("refuse threshold", "Extract", extract("c/nli", labels=TOPICS, threshold=1.5))
    yield Case("refuse no labels", "Extract", extract("c/nli"))
    yield Case("refuse nli option", "Extract", extract("c/nli", labels=TOPICS, options=options(multi_label="yes")))
    yield Case(
        "refuse nli unknown option", "Extract", extract("c/nli", labels=TOPICS, options=options(multilabel=True))
    )
    yield Case(
        "refuse muvera option",
        "Encode",
        encode("c/colbert", output_types=["dense"], options=options(muvera={"k_sim": 40})),
    )
    yield Case(
        "refuse muvera not a mapping", "Encode", encode("c/colbert", output_types=["dense"], options=options(muvera=3))
    )
    yield Case("refuse score mode", "Score", score("c/bge-m3", options=options(score_mode="best")))
    yield Case(
        "refuse score weights", "Score", score("c/bge-m3", options=options(score_mode="hybrid", score_weights={"x": 1}))
    )
    yield Case("refuse gif", "Encode", encode("c/clip", items=items(images=(GIF,))))
    yield Case("refuse garbage image", "Encode", encode("c/clip", items=items(images=(b"not an image at all",))))
    yield Case(
        "refuse format hint",
        "Encode",
        encode("c/clip", items=[types_pb2.Item(images=[types_pb2.Image(data=PNG, format="bmp")])]),
    )
    yield Case("refuse image too large", "Encode", encode("c/clip", items=items(images=(picture(5, (400, 300)),))))
    yield Case("refuse request images", "Encode", encode("c/clip", items=items(images=(WIDE,) * 12)))
    two = [types_pb2.Item(images=[types_pb2.Image(data=PNG), types_pb2.Image(data=JPEG)])]
    yield Case("refuse two images", "Encode", encode("c/clip", items=two))
    yield Case(
        "refuse text and image",
        "Encode",
        encode("c/clip", items=[types_pb2.Item(text="x", images=[types_pb2.Image(data=PNG)])]),
    )
    yield Case("refuse prompt too long", "Encode", encode("c/mean-no-prompt", instruction="prompt words " * 60))
    yield Case("refuse multivectors", "Encode", encode("c/colbert", [TEXTS[3]] * 40))
    yield Case("refuse score multivectors", "Score", score("c/colbert", texts=[TEXTS[3]] * 40))
    yield Case("refuse debug", "Encode", encode("c/mean", debug=True))
    yield Case("refuse load failure", "Score", score("c/splade-as-reranker"))
    yield Case("refuse dino label", "Extract", extract("c/grounding-dino", items=items(images=(PNG,)), labels=["a. b"]))
    yield Case(
        "refuse dino long labels",
        "Extract",
        extract("c/grounding-dino", items=items(images=(PNG,)), labels=["word " * 20]),
    )
    yield Case(
        "refuse dino option",
        "Extract",
        extract("c/grounding-dino", items=items(images=(PNG,)), labels=["x"], options=options(max_objects=0)),
    )
    yield Case("refuse reader without image", "Extract", extract("c/florence2", ["text only"]))
    yield Case(
        "refuse reader option",
        "Extract",
        extract("c/florence2", items=items(images=(PNG,)), options=options(task="<NOPE>")),
    )
    yield Case(
        "refuse glirel span",
        "Extract",
        extract("c/glirel", ["short"], labels=["x"], options=options(entities=[{"start": 0, "end": 99, "label": "p"}])),
    )
    yield Case("refuse glirel no entities", "Extract", extract("c/glirel", ["short"], labels=["x"]))
    yield Case(
        "refuse gliclass option",
        "Extract",
        extract("c/gliclass", labels=TOPICS, options=options(classification_type="many")),
    )


def stream_cases() -> Iterator[Case]:
    stream = [
        inference_pb2.EncodeStreamRequest(request=encode("c/mean", ["first"], request_id="a")),
        inference_pb2.EncodeStreamRequest(request=encode("c/mean", ["second"], dims=4, request_id="b")),
        inference_pb2.EncodeStreamRequest(request=encode("c/none", request_id="c")),
        inference_pb2.EncodeStreamRequest(request=encode("c/cls", ["untagged"])),
    ]
    yield Case("encode stream", "EncodeStream", stream, http=False)
    work = [
        worker_pb2.WorkRequest(request_id="w1", encode=encode("c/mean")),
        worker_pb2.WorkRequest(request_id="w2", score=score("c/reranker")),
        worker_pb2.WorkRequest(request_id="w3", extract=extract("c/nli", labels=TOPICS)),
        worker_pb2.WorkRequest(request_id="w4", encode=encode("c/mean", output_types=["nope"])),
        worker_pb2.WorkRequest(encode=encode("c/mean")),
    ]
    yield Case("work stream", "Work", work, http=False)


def corpus() -> list[Case]:
    cases = [*encode_cases(), *score_cases(), *extract_cases(), *refusal_cases(), *stream_cases()]
    names = [case.name for case in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases
