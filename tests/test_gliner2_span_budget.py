"""GLiNER2's span decoding within options.max_spans (sie_worker.adapters.families.gliner2_spans), in-process on a tiny
random replica, where the bounded and the plain `GLiNER2.batch_extract` compute the same numbers to the bit: within
the budget the same answer exactly (spans, confidences, order, every task); past it, each task's best max_spans
spans, a sub-list of GLiNER2's own answer in its order; and the decoding of a huge answer is quick.
(tests/test_gliner2_family.py sends the option to a worker.)"""

from __future__ import annotations

import random
from typing import Any

import pytest

from sie_worker.adapters.families.gliner2_spans import SpanBudget
from tiny_families import build_tiny_gliner2, gliner2_answers

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
    return gliner2_answers(model, texts, labels, schema, threshold, 200)


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


def count_candidates(model: Any) -> list[int]:
    """The candidate spans GLiNER2's Python decoding handles (each a tuple, compared with every span kept before it)
    on `model`, counted as it decodes."""
    counted = [0]
    find_spans = model._find_spans

    def counting(*args: Any, **kwargs: Any) -> Any:
        found = find_spans(*args, **kwargs)
        counted[0] += len(found)
        return found

    model._find_spans = counting
    return counted


def test_a_huge_answer_hands_gliner2s_decoding_only_the_spans_it_keeps(models: tuple[Any, Any, SpanBudget]) -> None:
    """128 labels over 200 words at a threshold of 0: GLiNER2 handles every (start, width) of every label in Python,
    keeping about 8,000 entities; within 1,000 it handles the 1,000 it keeps (times: docs/models.md)."""
    plain, bounded, budget = models
    budget.spans = 1000
    text = " ".join(f"word{i} Apple Paris" for i in range(67))
    labels = [f"type {i}" for i in range(128)]
    handled, bounded_handled = count_candidates(plain), count_candidates(bounded)
    (everything,) = extract(plain, [text], labels, {}, 0.0)
    (answer,) = extract(bounded, [text], labels, {}, 0.0)
    assert handled[0] == 128 * (200 * 4 - 6)  # every span of up to 4 of the 200 words read, for every label
    assert sum(len(found) for found in everything["entities"].values()) > 5000
    assert sum(len(found) for found in answer["entities"].values()) == bounded_handled[0] == 1000


def test_an_empty_text_and_a_text_of_spaces_answer_as_gliner2(models: tuple[Any, Any, SpanBudget]) -> None:
    plain, bounded, budget = models
    budget.spans = 1000
    texts = ["", "   ", "\u200b \u3000", "x"]
    assert extract(bounded, texts, ["a", "b"], SCHEMA, 0.0) == extract(plain, texts, ["a", "b"], SCHEMA, 0.0)


def decode_as_on_an_accelerator(model: Any) -> None:
    """Make `model` decode as GLiNER2 does on CUDA or MPS (`_extract_from_batch_sync_collapsed`: every task's scores
    moved to the CPU at once, then decoded), which a CPU run never takes."""

    def extract_from_batch(
        batch: Any,
        threshold: float,
        metadata_list: list[dict[str, Any]],
        include_confidence: bool,
        include_spans: bool,
        hidden_states: Any = None,
    ) -> list[dict[str, Any]]:
        token_embs, schema_embs = model.processor.extract_embeddings_from_batch(
            model.encode_tokens(batch, hidden_states), batch.input_ids, batch
        )
        raw_logits, pred_counts = model._compute_direct_span_logits_batched(batch, token_embs, schema_embs)
        return list(
            model._extract_from_batch_sync_collapsed(
                batch=batch,
                all_schema_embs=schema_embs,
                all_raw_logits=raw_logits,
                all_pred_counts=pred_counts,
                threshold=threshold,
                metadata_list=metadata_list,
                include_confidence=include_confidence,
                include_spans=include_spans,
            )
        )

    model._extract_from_batch = extract_from_batch


def test_the_accelerators_decoding_keeps_within_the_budget_too(tmp_path_factory: pytest.TempPathFactory) -> None:
    from gliner2 import GLiNER2

    directory = build_tiny_gliner2(tmp_path_factory.mktemp("gliner2-collapsed") / "model")
    plain, bounded = GLiNER2.from_pretrained(str(directory)), GLiNER2.from_pretrained(str(directory))
    budget = SpanBudget(bounded)
    for model in (plain, bounded):
        decode_as_on_an_accelerator(model)
    texts = [" ".join(f"word{i} Apple Paris" for i in range(40)), "Tim Cook sells the iPhone in Cupertino."]
    labels = ["company", "person", "place"]
    for threshold in (0.3, 0.0):
        budget.spans = 1000
        expected = extract(plain, texts, labels, SCHEMA, threshold)
        assert extract(bounded, texts, labels, SCHEMA, threshold) == expected
    assert sum(len(found) for found in expected[0]["entities"].values()) > 5
    budget.spans = 5
    (first, _) = extract(bounded, texts, labels, SCHEMA, 0.0)
    assert sum(len(found) for found in first["entities"].values()) == 5
