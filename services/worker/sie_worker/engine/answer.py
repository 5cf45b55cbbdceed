"""Finishing: each item's output through its adapter's `finish`, then what its task answers: an encode's outputs
after MUVERA, Matryoshka truncation and the output dtype; a score's items ranked (by the pair scorer's scores, or
each item's embeddings compared with the query's); an extract's extractions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sie_worker.adapters.items import EncodedItem
from sie_worker.engine.device import ItemResult
from sie_worker.engine.jobs import EncodedOutput, ScoredItem
from sie_worker.engine.plan import RequestPlan
from sie_worker.engine.postprocess import muvera, quantize, truncate
from sie_worker.engine.prepare import PreparedPart


def finished(plan: RequestPlan, parts: Sequence[PreparedPart], results: Sequence[Sequence[ItemResult]]) -> list[Any]:
    """Each item's output, by its row in the plan, through its adapter's `finish`."""
    outputs: list[Any] = [None] * len(plan.items)
    finish = plan.model.adapter.finish
    for part, prepared, part_results in zip(plan.parts, parts, results, strict=True):
        for row, read, ready, result in zip(part.rows, prepared.inputs, prepared.prepared, part_results, strict=True):
            outputs[row] = finish(read, ready.value, result.output, part.query)
    return outputs


def encoded(plan: RequestPlan, outputs: Sequence[EncodedItem]) -> list[EncodedOutput]:
    """Each item's requested outputs after MUVERA, `dims` and the output dtype."""
    return [_encoded(item, plan) for item in outputs]


def ranked(plan: RequestPlan, outputs: Sequence[Any]) -> list[ScoredItem]:
    """The items best first, cut to top_k: `outputs` is the query's, then each item's (a pair scorer: its score)."""
    query, items = outputs[0], outputs[1:]
    similarity = plan.similarity
    scores = [float(item) for item in items] if similarity is None else [similarity(query, item) for item in items]
    order = sorted(range(len(scores)), key=lambda index: -scores[index])
    return [ScoredItem(index, float(scores[index])) for index in order[: plan.top_k or None]]


def _encoded(item: EncodedItem, plan: RequestPlan) -> EncodedOutput:
    dense = None
    if "dense" in plan.outputs:
        if plan.muvera is None:
            dense = truncate(item.vector("dense"), dims=plan.dims, normalized=plan.model.adapter.normalized)
        else:
            multivector = item.vector("multivector")
            dense = muvera(multivector, plan.muvera, is_query=plan.is_query)
            dense = truncate(dense, dims=plan.dims, normalized=False)
    return EncodedOutput(
        dense=None if dense is None else quantize(dense, plan.output_dtype),
        sparse=item.sparse if "sparse" in plan.outputs else None,
        multivector=quantize(item.vector("multivector"), plan.output_dtype) if "multivector" in plan.outputs else None,
    )
