"""GLiNER2 (adapter gliner2) through a real worker against the `gliner2` package in-process, on a tiny random replica
of fastino/gliner2-base-v1's layout (span architecture, DeBERTa-v3-style backbone) built offline: the request's labels
as entity types and options.schema's classifications, structures and relations, answered as
`GLiNER2.batch_extract(..., include_confidence=True, include_spans=True)` answers (the same spans and labels,
confidences within 1e-4), texts past the model's words cut as GLiNER2 cuts them. And the bounds of options.schema."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import json_format

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_families import build_tiny_gliner2, gliner2_answers
from tiny_models import write_config
from worker_process import Services, inference_stub

GLINER2 = "test/tiny-gliner2"
# The shipped catalog file, its weights the replica's.
CATALOG_GLINER2 = "fastino/gliner2-base-v1"
CATALOG_FILE = Path(__file__).resolve().parents[1] / "catalog" / "models" / "fastino__gliner2-base-v1.yaml"
# The replica with an encoder config naming code shipped with the weights, which gliner2 would build the backbone from.
SHIPPED_CODE = "test/tiny-gliner2-shipped-code"
MAX_WORDS = 40
LABELS = ["company", "product", "person"]
TEXTS = [
    "Apple released the iPhone 15 in Cupertino on Tuesday. Tim Cook said sales were strong.",
    "hello world",
    "Ünïcödé 🚀 文字: Marie Curie worked in Paris for the University of Paris.",
    " ".join(["Acme sells anvils to Wile E. Coyote in the desert."] * 12),  # past MAX_WORDS: cut
]
SCHEMA = {
    "classifications": [
        {"task": "sentiment", "labels": ["positive", "negative", "neutral"]},
        {"task": "topics", "labels": ["tech", "science", "business"], "multi_label": True, "cls_threshold": 0.3},
    ],
    "structures": {
        "launch": {
            "fields": [{"name": "company", "dtype": "str"}, {"name": "product"}, {"name": "place", "dtype": "str"}]
        }
    },
    "relations": ["works_for", "located_in"],
}


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_gliner2(tmp_path_factory.mktemp("gliner2") / "model")


@pytest.fixture(scope="module")
def gliner2_stub(
    services: Services, replica: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[inference_pb2_grpc.InferenceStub]:
    configs = tmp_path_factory.mktemp("gliner2-configs")
    shipped = replica.parent / "shipped-code"
    shutil.copytree(replica, shipped)
    encoder = shipped / "encoder_config" / "config.json"
    encoder.write_text(json.dumps({**json.loads(encoder.read_text()), "auto_map": {"AutoModel": "backbone.Model"}}))
    for model_id, directory in ((GLINER2, replica), (SHIPPED_CODE, shipped)):
        write_config(
            configs,
            model_id,
            f"path: {directory}\ntasks: [extract]\nmax_sequence_length: {MAX_WORDS}\n"
            "profiles:\n  default:\n    adapter: gliner2\n",
        )
    shipped_config = yaml.safe_load(CATALOG_FILE.read_text())
    del shipped_config["hf_id"]
    (configs / "catalog.yaml").write_text(yaml.safe_dump({**shipped_config, "path": str(replica)}))
    preload = f"{GLINER2},{CATALOG_GLINER2}"
    worker = services.worker({"SIE_MODELS_DIR": str(configs), "SIE_PRELOAD_MODELS": preload}, name="gliner2")
    with inference_stub(worker) as gliner2_stub:
        yield gliner2_stub


def extract(gliner2_stub, texts: list[str], labels: list[str], **options: Any) -> inference_pb2.ExtractResponse:
    threshold = options.pop("threshold", None)
    request = inference_pb2.ExtractRequest(
        model=options.pop("model", GLINER2),
        items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)],
        labels=labels,
        threshold=threshold,
    )
    request.options.update(options)
    response, _ = call_until_loaded(lambda: gliner2_stub.Extract(request, timeout=120))
    return response


def reference(
    replica: Path, texts: list[str], labels: list[str], schema: dict[str, Any], threshold: float, words: int
) -> list[dict[str, Any]]:
    from gliner2 import GLiNER2

    return gliner2_answers(GLiNER2.from_pretrained(str(replica)), texts, labels, schema, threshold, words)


def assert_close(served: Any, expected: Any, where: str = "") -> None:
    """The same JSON shape, strings and whole numbers equal, other numbers within 1e-4 (a Struct's are floats)."""
    if isinstance(expected, dict):
        assert isinstance(served, dict) and sorted(served) == sorted(expected), where
        for key in expected:
            assert_close(served[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(served, list) and len(served) == len(expected), where
        for index, (one, other) in enumerate(zip(served, expected, strict=True)):
            assert_close(one, other, f"{where}[{index}]")
    elif isinstance(expected, float):
        assert served == pytest.approx(expected, abs=1e-4), where
    else:
        assert served == expected, where


@pytest.mark.parametrize(
    ("model", "schema", "threshold"),
    [(GLINER2, {}, None), (GLINER2, SCHEMA, 0.3), (CATALOG_GLINER2, SCHEMA, None), (CATALOG_GLINER2, {}, 0.3)],
    ids=["entities", "schema-0.3", "catalog-schema", "catalog-entities-0.3"],
)
def test_gliner2_equals_batch_extract(
    gliner2_stub, replica: Path, model: str, schema: dict[str, Any], threshold: float | None
) -> None:
    """The shipped config reads 512 words, the other model 40: the long text is cut only by the other."""
    words = 512 if model == CATALOG_GLINER2 else MAX_WORDS
    expected = reference(replica, TEXTS, LABELS, schema, 0.5 if threshold is None else threshold, words)
    response = extract(
        gliner2_stub, TEXTS, LABELS, threshold=threshold, model=model, **({"schema": schema} if schema else {})
    )
    found = 0
    for result, answer in zip(response.results, expected, strict=True):
        spans = [(label, span) for label in LABELS for span in answer["entities"][label]]
        served = [
            (e.label, {"text": e.text, "confidence": e.score, "start": e.start, "end": e.end}) for e in result.entities
        ]
        assert [label for label, _ in served] == [label for label, _ in spans]
        assert_close([span for _, span in served], [span for _, span in spans])
        others = {key: value for key, value in answer.items() if key != "entities"}
        assert_close(json_format.MessageToDict(result.data) if result.HasField("data") else {}, others)
        found += len(spans)
        assert set(others) == ({"sentiment", "topics", "launch", "relation_extraction"} if schema else set())
    assert found > 0  # the replica finds spans at these thresholds: the comparison compares something
    ends = max((e.end for e in response.results[-1].entities), default=0)
    assert (ends <= len(TEXTS[-1]) // 3) == (model == GLINER2)  # cut at 40 of its 120 words, or read whole


def test_an_entity_span_is_the_text_it_names(gliner2_stub) -> None:
    response = extract(gliner2_stub, TEXTS[:3], LABELS, threshold=0.3)
    for result, text in zip(response.results, TEXTS, strict=False):
        assert all(text[e.start : e.end] == e.text for e in result.entities)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ("sentiment", "options.schema: must be an object with classifications, structures, relations"),
        ({"entities": ["person"]}, "entities are the request's labels"),
        ({"json_structures": {}}, "unknown keys ['json_structures']"),
        ({"relations": [f"r{i}" for i in range(33)]}, "33 classification tasks, structures and relations; at most 32"),
        (
            {"classifications": [{"task": "t", "labels": [f"l{i}" for i in range(65)]}]},
            "classifications[0].labels: 65 entries; at most 64",
        ),
        ({"classifications": [{"task": "t", "labels": ["only"], "threshold": 2}]}, "options.schema:"),
        ({"structures": {"s": {"fields": [{"name": "f", "dtype": "float"}]}}}, "options.schema:"),
        # Before: answered under one key, the entities (or the other task) silently lost.
        ({"classifications": [{"task": "entities", "labels": ["a", "b"]}]}, "'entities' names two answers"),
        (
            {
                "classifications": [{"task": "s", "labels": ["a", "b"]}],
                "structures": {"s": {"fields": [{"name": "f"}]}},
            },
            "'s' names two answers",
        ),
        # Before: IndexError in GLiNER2's decoding, INTERNAL.
        ({"relations": {"works_for": "who [E] works for whom"}}, "holds one of GLiNER2's prompt tokens"),
    ],
)
def test_a_schema_out_of_bounds_is_invalid_options(gliner2_stub, schema: Any, message: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], LABELS, schema=schema)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "INVALID_OPTIONS"
    assert message in raised.value.details()
    assert len(raised.value.details()) < 2048


def test_labels_and_a_schema_past_the_prompt_bound_are_labels_too_long(gliner2_stub) -> None:
    """Each within its own bounds, together a prompt of more than 1,024 tokens: refused before any work."""
    labels = [f"entity type number {i} of a long list" for i in range(100)]
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], labels, schema={"relations": [f"relation {i}" for i in range(30)]})
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "LABELS_TOO_LONG"
    assert "this model reads at most 1024 before the text" in raised.value.details()
    assert int(error_info(raised.value).metadata["tokens"]) > 1024
    assert len(extract(gliner2_stub, TEXTS[:1], labels[:20]).results) == 1  # fewer labels: answered


def test_a_schema_over_the_options_bound_is_options_too_large(gliner2_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], LABELS, schema={"relations": {"r": "x" * 17000}})
    assert error_info(raised.value).reason == "OPTIONS_TOO_LARGE"


@pytest.mark.parametrize("label", ["[E] person", "company [SEP_TEXT]", "[p]"])
def test_a_label_holding_a_prompt_token_is_invalid_label(gliner2_stub, label: str) -> None:
    """Before: GLiNER2 read it as part of its prompt and failed decoding with an IndexError (INTERNAL)."""
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], ["person", label])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error_info(raised.value).reason, error_info(raised.value).metadata["label"]) == ("INVALID_LABEL", "1")


@pytest.mark.parametrize("schema", [None, {}, {"classifications": [], "relations": []}])
def test_no_labels_and_no_schema_task_is_no_labels(gliner2_stub, schema: dict[str, Any] | None) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], [], **({} if schema is None else {"schema": schema}))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "NO_LABELS"


def test_an_unknown_option_is_refused(gliner2_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], LABELS, schemas=SCHEMA)
    assert error_info(raised.value).reason == "UNKNOWN_OPTION"


def test_a_checkpoint_naming_shipped_code_fails_to_load(gliner2_stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], LABELS, model=SHIPPED_CODE)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "encoder_config/config.json: auto_map names code shipped with the weights" in raised.value.details()


@pytest.mark.parametrize(
    "schema",
    [
        {"classifications": SCHEMA["classifications"]},
        {"structures": SCHEMA["structures"], "relations": SCHEMA["relations"]},
        SCHEMA,
    ],
    ids=["classifications", "structures-relations", "all"],
)
def test_a_schema_without_labels_equals_batch_extract_without_entities(
    gliner2_stub, replica: Path, schema: dict[str, Any]
) -> None:
    """Before: NO_LABELS. GLiNER2 answers a schema without entities with the schema's tasks alone."""
    from gliner2 import GLiNER2, Schema

    model = GLiNER2.from_pretrained(str(replica))
    expected = model.batch_extract(
        TEXTS, Schema.from_dict(schema), include_confidence=True, include_spans=True, max_len=MAX_WORDS
    )
    response = extract(gliner2_stub, TEXTS, [], schema=schema)
    for result, answer in zip(response.results, expected, strict=True):
        assert "entities" not in answer and list(result.entities) == []
        assert_close(json_format.MessageToDict(result.data), answer)
    if "classifications" in schema:
        assert {json_format.MessageToDict(r.data)["sentiment"]["label"] for r in response.results} <= {
            "positive",
            "negative",
            "neutral",
        }


# A text of 360 words: at a threshold of 0 every span of every label passes it.
LONG_TEXT = " ".join(f"word{i} Apple Paris" for i in range(120))


def served_spans(result: Any) -> list[tuple[str, float, int, int]]:
    return [(e.label, e.score, e.start, e.end) for e in result.entities]


@pytest.mark.parametrize("max_spans", [1, 7, 100])
def test_max_spans_keeps_the_best_entities_in_gliner2s_order(gliner2_stub, replica: Path, max_spans: int) -> None:
    """At a threshold of 0 GLiNER2 keeps about words x labels entities; the answer holds the best max_spans of them
    (the same confidences as the best of GLiNER2's whole answer; which spans and in what order: in-process, where the
    numbers are the same to the bit, tests/test_gliner2_span_budget.py)."""
    labels = [f"type {i}" for i in range(8)]
    (answer,) = reference(replica, [LONG_TEXT], labels, {}, 0.0, MAX_WORDS)
    everything = [
        (label, span["confidence"], span["start"], span["end"])
        for label in labels
        for span in answer["entities"][label]
    ]
    assert len(everything) > 100
    (result,) = extract(gliner2_stub, [LONG_TEXT], labels, threshold=0.0, max_spans=max_spans).results
    served = served_spans(result)
    assert len(served) == max_spans
    best = sorted((score for _, score, _, _ in everything), reverse=True)[:max_spans]
    assert sorted((score for _, score, _, _ in served), reverse=True) == pytest.approx(best, abs=1e-4)


def test_the_default_max_spans_is_1000_and_a_huge_answer_decodes_quickly(gliner2_stub) -> None:
    """Before: 128 labels over 512 words at a threshold of 0 were 22,000 entities and 13 s of decoding for one
    text (seconds more per text of the request). The shipped config reads 512 words."""
    labels = [f"entity type {i}" for i in range(128)]
    text = " ".join(f"word{i} Apple Paris" for i in range(171))
    started = time.monotonic()
    response = extract(gliner2_stub, [text, text], labels, threshold=0.0, model=CATALOG_GLINER2)
    assert [len(result.entities) for result in response.results] == [1000, 1000]
    assert time.monotonic() - started < 60  # does not hang; bench/ has no timing of it


def test_max_spans_bounds_each_structures_list_fields_and_keeps_each_str_fields_best(
    gliner2_stub, replica: Path
) -> None:
    """The list fields' own threshold at 0 (the request's threshold does not reach it): a structure keeps its best
    max_spans list spans; a `str` field and a relation's head and tail keep their best span, as GLiNER2 does."""
    fields = [{"name": f"field {i}", "threshold": 0.0} for i in range(6)]
    schema = {
        "structures": {
            "record": {"fields": fields},
            "one": {"fields": [{"name": "value", "dtype": "str", "threshold": 0.5}]},
        },
        "relations": {"knows": {"threshold": 0.5}},
    }
    (answer,) = reference(replica, [LONG_TEXT], ["person"], schema, 0.9, MAX_WORDS)
    (result,) = extract(gliner2_stub, [LONG_TEXT], ["person"], threshold=0.9, max_spans=20, schema=schema).results
    data = json_format.MessageToDict(result.data)

    def list_scores(instances: list[dict[str, Any]]) -> list[float]:
        return sorted((span["confidence"] for record in instances for f in record.values() for span in f), reverse=True)

    assert len(list_scores(answer["record"])) > 20
    assert list_scores(data["record"]) == pytest.approx(list_scores(answer["record"])[:20], abs=1e-4)
    # The replica scores a `str` field's spans alike (to 1e-4): which one is best is the worker's threads' to break.
    for served, expected in (
        (data["one"], answer["one"]),
        (data["relation_extraction"], answer["relation_extraction"]),
    ):
        assert_close(confidences(served), confidences(expected))


def confidences(value: Any) -> list[float]:
    """Every confidence in an answer, in its order."""
    if isinstance(value, dict):
        return (
            [value["confidence"]]
            if "confidence" in value
            else [c for item in value.values() for c in confidences(item)]
        )
    return [c for item in value for c in confidences(item)] if isinstance(value, list) else []


@pytest.mark.parametrize("value", [0, 1001, 2.5, "10", True])
def test_max_spans_out_of_bounds_is_invalid_options(gliner2_stub, value: Any) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(gliner2_stub, TEXTS[:1], LABELS, max_spans=value)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "INVALID_OPTIONS"
    assert "max_spans: must be a whole number from 1 to 1000" in raised.value.details()
