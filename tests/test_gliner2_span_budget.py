"""GLiNER2's span decoding within options.max_spans (sie_worker.adapters.families.gliner2_spans), in-process on a tiny
random replica, where the bounded and the plain `GLiNER2.batch_extract` compute the same numbers to the bit: within
the budget the same answer exactly (spans, confidences, order, every task); past it, each task's best max_spans
spans, a sub-list of GLiNER2's own answer in its order; and the decoding of a huge answer is quick.
(tests/test_gliner2_family.py sends the option to a worker.)"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from sie_worker.adapters.families.gliner2_spans import SpanBudget
from tiny_families import build_tiny_gliner2

# Words of the texts: a zero-width space and a prompt token among them.
WORDS = ["Apple", "Paris", "Tim", "Cook", "sells", "the", "iPhone", "in", "Cupertino", ",", ".", "and", "Marie"]
WORDS += ["Curie", "🚀", "文字", "Ünïcödé", "[E]", "\u200b"]
SCHEMA = {
    "classifications": [{"task": "sentiment", "labels": ["positive", "negative"]}],
    "structures": {
        "launch": {
            "fields": [
                {"name": "company", "dtype": "str"},
                {"name": "product"},
                {"name": "place", "threshold": 0.05},
                {"name": "kind", "choices": ["phone", "laptop"]},
            ]
        }
    },
    "relations": {"works_for": {}, "located_in": {"threshold": 0.02}},
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, SpanBudget]:
    """The plain GLiNER2 and one whose decoding keeps within a SpanBudget, on the same weights."""
    from gliner2 import GLiNER2

    directory = build_tiny_gliner2(tmp_path_factory.mktemp("gliner2-budget") / "model")
    bounded = GLiNER2.from_pretrained(str(directory))
    return GLiNER2.from_pretrained(str(directory)), bounded, SpanBudget(bounded)


def extract(model: Any, texts: list[str], labels: list[str], schema: dict[str, Any], threshold: float) -> list[Any]:
    from gliner2 import Schema

    return model.batch_extract(
        texts,
        Schema.from_dict({"entities": labels, **schema}),
        threshold=threshold,
        include_confidence=True,
        include_spans=True,
        max_len=200,
    )


def test_within_the_budget_the_answer_is_gliner2s_exactly(models: tuple[Any, Any, SpanBudget]) -> None:
    plain, bounded, budget = models
    budget.spans = 1000
    chosen = random.Random(7)
    compared = 0
    for threshold in (0.0, 0.02, 0.3, 0.5, 0.9):
        texts = [" ".join(chosen.choice(WORDS) for _ in range(chosen.randint(0, 150))) for _ in range(3)]
        labels = [f"type {i}" for i in range(chosen.randint(1, 6))]
        for schema in ({}, SCHEMA):
            expected = extract(plain, texts, labels, schema, threshold)
            assert extract(bounded, texts, labels, schema, threshold) == expected
            compared += sum(len(spans) for answer in expected for spans in answer["entities"].values())
    assert compared > 500  # low thresholds: many spans compared


@pytest.mark.parametrize("spans", [1, 5, 40])
def test_past_the_budget_each_task_keeps_its_best_spans_in_gliner2s_order(
    models: tuple[Any, Any, SpanBudget], spans: int
) -> None:
    plain, bounded, budget = models
    text = " ".join(f"word{i} Apple Paris" for i in range(60))
    labels = [f"type {i}" for i in range(5)]
    schema = {"structures": {"record": {"fields": [{"name": f"f{i}", "threshold": 0.0} for i in range(3)]}}}
    (everything,) = extract(plain, [text], labels, schema, 0.0)
    budget.spans = spans
    (answer,) = extract(bounded, [text], labels, schema, 0.0)

    def entities(result: dict[str, Any]) -> list[tuple[str, float, int, int]]:
        return [(label, s["confidence"], s["start"], s["end"]) for label in labels for s in result["entities"][label]]

    def record_spans(result: dict[str, Any]) -> list[tuple[str, float, int, int]]:
        """A structure's spans (an instance that keeps none is left out, by GLiNER2 as by the budget)."""
        return [
            (name, s["confidence"], s["start"], s["end"])
            for record in result["record"]
            for name, found in record.items()
            for s in found
        ]

    for full, kept in ((entities(everything), entities(answer)), (record_spans(everything), record_spans(answer))):
        assert len(full) > spans
        assert len(kept) == spans
        assert sorted(s[1] for s in kept) == sorted(s[1] for s in full)[-spans:]
    assert [s for s in entities(everything) if s in entities(answer)] == entities(answer)  # GLiNER2's order


def test_a_huge_answer_decodes_in_a_fraction_of_gliner2s_time(models: tuple[Any, Any, SpanBudget]) -> None:
    """128 labels over 200 words at a threshold of 0: GLiNER2 keeps about 8,000 entities, checking each candidate
    against every span kept before it; within 1,000 the same encoder pass decodes several times faster."""
    plain, bounded, budget = models
    budget.spans = 1000
    text = " ".join(f"word{i} Apple Paris" for i in range(67))
    labels = [f"type {i}" for i in range(128)]
    started = time.monotonic()
    (everything,) = extract(plain, [text], labels, {}, 0.0)
    unbounded_s = time.monotonic() - started
    started = time.monotonic()
    (answer,) = extract(bounded, [text], labels, {}, 0.0)
    bounded_s = time.monotonic() - started
    assert sum(len(found) for found in everything["entities"].values()) > 5000
    assert sum(len(found) for found in answer["entities"].values()) == 1000
    assert bounded_s < unbounded_s  # generous: measured about 10 times faster (docs/models.md)


def test_an_empty_text_and_a_text_of_spaces_answer_as_gliner2(models: tuple[Any, Any, SpanBudget]) -> None:
    plain, bounded, budget = models
    budget.spans = 1000
    texts = ["", "   ", "\u200b \u3000", "x"]
    assert extract(bounded, texts, ["a", "b"], SCHEMA, 0.0) == extract(plain, texts, ["a", "b"], SCHEMA, 0.0)
