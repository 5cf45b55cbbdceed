"""Adversarial input against GLiNER2 (adapter gliner2, issue 36), served by one real worker from a tiny random replica
of fastino/gliner2-base-v1's layout (tools/tiny_families.py).

What broke: GLiNER2 cuts a text at its first `max_len` words but never cuts their subword tokens, and its encoder
(DeBERTa-v3, relative positions: no length limit) grows with the square of its input, so one long "word" (a URL of
4,000 characters, 4,000 tokens) held the device 11 s, and 8,000 characters 57 s and 4.8 GB; a blank label was refused
as a schema problem (INVALID_OPTIONS naming options.schema, which the request did not send). What held is kept here
too: hostile schemas refused with INVALID_OPTIONS or LABELS_TOO_LONG before any work.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_worker.adapters.families.gliner2 import (
    CACHED_WORD_CHARS,
    MAX_TEXT_TOKENS,
    MAX_WORD_CHARS,
    _bounded_token_cache,
)
from tiny_families import build_tiny_gliner2, gliner2_answers
from tiny_models import write_config
from worker_process import Services, inference_stub

MODEL = "test/adv-gliner2"
TEXT = "Apple released the iPhone 15 in Cupertino. Tim Cook said sales were strong."
# Words the replica's tokenizer (WordPiece, a small vocabulary) splits into one token per character: 41 tokens each.
LONG_WORDS = [f"{'zq' * 20}{index % 10}" for index in range(120)]


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_gliner2(tmp_path_factory.mktemp("adv-gliner2") / "model")


@pytest.fixture(scope="module")
def stub(
    services: Services, replica: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("adv-gliner2-configs")
    write_config(configs, MODEL, f"path: {replica}\ntasks: [extract]\nprofiles:\n  default:\n    adapter: gliner2\n")
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": MODEL}, name="adv-gliner2")
    with inference_stub(worker) as stub:
        yield stub


def extract(stub, text: str, labels: list[str], **options: Any) -> inference_pb2.ExtractResponse:
    threshold = options.pop("threshold", None)
    request = inference_pb2.ExtractRequest(
        model=MODEL, items=[types_pb2.Item(id="0", text=text)], labels=labels, threshold=threshold
    )
    request.options.update(options)
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=120))
    return response


def refusal(stub, text: str, labels: list[str], **options: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, text, labels, **options)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value.details()
    return raised.value


def read_part(replica: Path, text: str) -> str:
    """The text up to the last word whose tokens (as GLiNER2 tokenizes each word) keep it within MAX_TEXT_TOKENS."""
    from gliner2 import GLiNER2

    processor = GLiNER2.from_pretrained(str(replica)).processor
    tokens = read = 0
    for word, _, end in processor.word_splitter(text):
        tokens += len(processor.tokenizer.tokenize(word))
        if tokens > MAX_TEXT_TOKENS:
            break
        read = end
    return text[:read]


def test_words_past_the_token_bound_are_not_read(stub, replica: Path) -> None:
    """120 words of 41 tokens after a sentence: the words past 2,048 tokens are cut, as words past max_len are, and
    the answer is GLiNER2's for the text that is left (at threshold 0, every word read holds some span)."""
    text = f"{TEXT} {' '.join(LONG_WORDS)} Tim Cook visited Paris."
    cut = read_part(replica, text)
    assert TEXT in cut and len(cut) < len(text) - 2000  # the bound cuts the long words, well before the end
    labels = ["person", "company"]
    served = extract(stub, text, labels, threshold=0.0, max_spans=1000)
    entities = [json_format.MessageToDict(entity) for entity in served.results[0].entities]
    # GLiNER2 reads a text that does not end a sentence with a "." after it, and may find a span there
    assert entities and max(entity["end"] for entity in entities) <= len(cut) + 1
    from gliner2 import GLiNER2

    answer = gliner2_answers(GLiNER2.from_pretrained(str(replica)), [cut], labels, {}, 0.0, 512)[0]["entities"]
    expected = [(span["text"], label, span["start"], span["end"]) for label in labels for span in answer[label]]
    assert [(e["text"], e["label"], e.get("start", 0), e["end"]) for e in entities] == expected


@pytest.mark.parametrize(
    "word",
    ["https://" + "a/" * 1500, "a" * (MAX_WORD_CHARS + 1), "b" * 2_000_000],
    ids=["url-of-3000-tokens", "word-over-the-character-bound", "word-of-2-mb"],
)
def test_a_word_over_the_token_bound_ends_the_text(stub, word: str) -> None:
    """A URL of 3,000 tokens is one GLiNER2 word: it is not read, nor what follows it (the device read it whole
    before: 11 s for 4,000 tokens on this replica, 57 s and 4.8 GB for 8,000). A word of more than MAX_WORD_CHARS
    characters is past the bound without being tokenized (this replica's WordPiece reads it as one unknown token;
    a SentencePiece tokenizer, as the real checkpoint's, as thousands)."""
    served = extract(stub, f"{TEXT} {word} Tim Cook visited Paris.", ["person"], threshold=0.0)
    entities = [json_format.MessageToDict(entity) for entity in served.results[0].entities]
    assert entities and max(entity["end"] for entity in entities) <= len(TEXT) + 1


@pytest.mark.parametrize("labels", [["person", ""], ["person", " \t"]], ids=["empty", "blank"])
def test_a_blank_label_is_an_invalid_label(stub, labels: list[str]) -> None:
    error = refusal(stub, TEXT, labels)
    assert error_info(error).reason == "INVALID_LABEL"
    assert error_info(error).metadata["label"] == "1"
    assert "schema" not in error.details()


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"classifications": [{"task": 5, "labels": ["a", "b"]}]}, "INVALID_OPTIONS"),
        ({"structures": {"s": {"fields": [{"name": 5}]}}}, "INVALID_OPTIONS"),
        (
            {"classifications": [{"task": "t", "labels": ["a", "b"], "top_k": 1e300, "multi_label": True}]},
            "INVALID_OPTIONS",
        ),
        (
            {"classifications": [{"task": "t", "labels": ["a", "b"], "examples": [["[SEP_TEXT]", "a"]]}]},
            "INVALID_OPTIONS",
        ),
        ({"entity_attributes": {"g": {"labels": ["x"]}}}, "INVALID_OPTIONS"),
        (
            {"structures": {"s": {"fields": [{"name": "f", "choices": [f"c{i}" for i in range(1500)]}]}}},
            "LABELS_TOO_LONG",
        ),
        (
            {"classifications": [{"task": "t", "labels": ["a", "b"], "examples": [["x y z", "a"]] * 400}]},
            "LABELS_TOO_LONG",
        ),
    ],
    ids=["number-task", "number-field", "huge-top-k", "prompt-token-in-example", "attributes", "choices", "examples"],
)
def test_hostile_schemas_are_refused_before_any_work(stub, schema: dict[str, Any], reason: str) -> None:
    assert error_info(refusal(stub, TEXT, ["person"], schema=schema)).reason == reason


def test_the_word_cache_keeps_short_words_only(replica: Path) -> None:
    """GLiNER2 caches the subwords of up to 50,000 words: a long word is tokenized each time instead, so a stream
    of long distinct words cannot fill the cache with megabytes each."""
    from gliner2 import GLiNER2

    processor = GLiNER2.from_pretrained(str(replica)).processor
    cache = processor._tokenize_cached
    tokenize = _bounded_token_cache(processor)
    long_word = "zq" * CACHED_WORD_CHARS
    assert tokenize(long_word) == processor.tokenizer.tokenize(long_word)
    assert processor._tokenize_cached(long_word) == processor.tokenizer.tokenize(long_word)
    assert cache.cache_info().currsize == 0
    tokenize("acme")
    assert cache.cache_info().currsize == 1
