"""GLiNER2 (adapter gliner2) through a real worker against the `gliner2` package in-process, on a tiny random replica
of fastino/gliner2-base-v1's layout (span architecture, DeBERTa-v3-style backbone) built offline: the request's labels
as entity types and options.schema's classifications, structures and relations, answered as
`GLiNER2.batch_extract(..., include_confidence=True, include_spans=True)` answers (the same spans and labels,
confidences within 1e-4), texts past the model's words cut as GLiNER2 cuts them. And the bounds of options.schema."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from google.protobuf import json_format

from grpc_helpers import call_until_loaded, error_info
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tiny_families import build_tiny_gliner2
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
def stub(
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
    with inference_stub(worker) as stub:
        yield stub


def extract(stub, texts: list[str], labels: list[str], **options: Any) -> inference_pb2.ExtractResponse:
    threshold = options.pop("threshold", None)
    request = inference_pb2.ExtractRequest(
        model=options.pop("model", GLINER2),
        items=[types_pb2.Item(id=str(i), text=t) for i, t in enumerate(texts)],
        labels=labels,
        threshold=threshold,
    )
    request.options.update(options)
    response, _ = call_until_loaded(lambda: stub.Extract(request, timeout=120))
    return response


def reference(
    replica: Path, texts: list[str], labels: list[str], schema: dict[str, Any], threshold: float, words: int
) -> list[dict[str, Any]]:
    from gliner2 import GLiNER2, Schema

    model = GLiNER2.from_pretrained(str(replica))
    return model.batch_extract(
        texts,
        Schema.from_dict({"entities": labels, **schema}),
        threshold=threshold,
        include_confidence=True,
        include_spans=True,
        max_len=words,
    )


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
    stub, replica: Path, model: str, schema: dict[str, Any], threshold: float | None
) -> None:
    """The shipped config reads 512 words, the other model 40: the long text is cut only by the other."""
    words = 512 if model == CATALOG_GLINER2 else MAX_WORDS
    expected = reference(replica, TEXTS, LABELS, schema, 0.5 if threshold is None else threshold, words)
    response = extract(stub, TEXTS, LABELS, threshold=threshold, model=model, **({"schema": schema} if schema else {}))
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


def test_an_entity_span_is_the_text_it_names(stub) -> None:
    response = extract(stub, TEXTS[:3], LABELS, threshold=0.3)
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
def test_a_schema_out_of_bounds_is_invalid_options(stub, schema: Any, message: str) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], LABELS, schema=schema)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "INVALID_OPTIONS"
    assert message in raised.value.details()
    assert len(raised.value.details()) < 2048


def test_labels_and_a_schema_past_the_prompt_bound_are_labels_too_long(stub) -> None:
    """Each within its own bounds, together a prompt of more than 1,024 tokens: refused before any work."""
    labels = [f"entity type number {i} of a long list" for i in range(100)]
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], labels, schema={"relations": [f"relation {i}" for i in range(30)]})
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_info(raised.value).reason == "LABELS_TOO_LONG"
    assert "this model reads at most 1024 before the text" in raised.value.details()
    assert int(error_info(raised.value).metadata["tokens"]) > 1024
    assert len(extract(stub, TEXTS[:1], labels[:20]).results) == 1  # fewer labels: answered


def test_a_schema_over_the_options_bound_is_options_too_large(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], LABELS, schema={"relations": {"r": "x" * 17000}})
    assert error_info(raised.value).reason == "OPTIONS_TOO_LARGE"


@pytest.mark.parametrize("label", ["[E] person", "company [SEP_TEXT]", "[p]"])
def test_a_label_holding_a_prompt_token_is_invalid_label(stub, label: str) -> None:
    """Before: GLiNER2 read it as part of its prompt and failed decoding with an IndexError (INTERNAL)."""
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], ["person", label])
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (error_info(raised.value).reason, error_info(raised.value).metadata["label"]) == ("INVALID_LABEL", "1")


def test_no_labels_and_an_unknown_option_are_refused(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], [], schema=SCHEMA)
    assert error_info(raised.value).reason == "NO_LABELS"
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], LABELS, schemas=SCHEMA)
    assert error_info(raised.value).reason == "UNKNOWN_OPTION"


def test_a_checkpoint_naming_shipped_code_fails_to_load(stub) -> None:
    with pytest.raises(grpc.RpcError) as raised:
        extract(stub, TEXTS[:1], LABELS, model=SHIPPED_CODE)
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(raised.value).reason == "MODEL_LOAD_FAILED"
    assert "encoder_config/config.json: auto_map names code shipped with the weights" in raised.value.details()
