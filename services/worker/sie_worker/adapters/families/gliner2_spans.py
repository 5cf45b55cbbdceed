"""GLiNER2's span decoding within a budget of spans per task.

GLiNER2 (span architecture) decodes each entity type, each structure field and each relation argument from every
(start word, width) whose score passes its threshold: each becomes a Python tuple, then a greedy pass keeps them best
first, dropping those that overlap a span kept before (in Python, each against every span kept). At a threshold near 0
that is words x max_width candidates per row and up to words spans kept per row: 128 labels over 512 words gave
22,000 entities and 13 s of decoding for one text.

`keep_within` masks (NaN: no threshold passes it) every candidate of a task's rows but the ones GLiNER2's own
greedy pass would keep and the answer shows, best first, at most `budget` of them for the task's `list` rows together
(the entity types; a structure's `list` fields), and the best one of each row the answer shows one span of (a `str`
field, a relation's head and tail). GLiNER2 then decodes what is left: the same spans, confidences and order as
without the mask wherever the task keeps at most `budget`; beyond it, its best `budget`. The greedy pass here is
GLiNER2's (its candidates ranked by score, ties in (start, width) order; a span is kept unless its characters overlap
one kept before in its row), run over the candidates it needs only: each kept span can suppress at most
(2 x max_width - 1) x max_width others, so the task's first budget x (that + 1) candidates hold every span kept.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# The most spans a task's `list` rows keep together (options.max_spans), and its default.
MAX_SPANS = 1000
DEFAULT_MAX_SPANS = MAX_SPANS


@dataclass(frozen=True)
class Row:
    """How GLiNER2 decodes one row of a task (an entity type, a structure field, a relation argument)."""

    threshold: float
    # The answer shows only the row's best span (a `str` field, a relation's head or tail).
    single: bool


def task_rows(
    schema_name: str,
    task_type: str,
    field_names: Sequence[str],
    threshold: float,
    metadata: Mapping[str, Any],
    cls_fields: Mapping[str, Any],
) -> list[Row | None]:
    """Per field of the task, how GLiNER2 decodes its spans (its metadata's threshold and dtype), None for a field it
    reads no span of: a structure's choice field (scored on its choices, not the text), a name repeated (GLiNER2 reads
    its first)."""
    rows: list[Row | None] = []
    for index, name in enumerate(field_names):
        if field_names.index(name) != index:
            rows.append(None)
            continue
        if schema_name == "entities":
            meta = metadata.get("entity_metadata", {}).get(name, {})
        elif task_type == "relations":
            meta = {**metadata.get("relation_metadata", {}).get(schema_name, {}), "dtype": "str"}
        elif f"{schema_name}.{name}" in cls_fields:
            rows.append(None)
            continue
        else:
            meta = metadata.get("field_metadata", {}).get(f"{schema_name}.{name}", {})
        own = meta.get("threshold")
        rows.append(Row(float(threshold if own is None else own), meta.get("dtype", "list") != "list"))
    return rows


def readable_spans(text: str, start_map: Sequence[int], end_map: Sequence[int], width: int) -> torch.Tensor:
    """[words, width]: whether GLiNER2 makes a candidate of the span (inside the text, not only whitespace)."""
    words = len(start_map)
    valid = torch.zeros(words, width, dtype=torch.bool)
    for start in range(words):
        for extra in range(min(width, words - start)):
            try:
                valid[start, extra] = bool(text[start_map[start] : end_map[start + extra]].strip())
            except (IndexError, KeyError):
                continue
    return valid


def keep_within(
    span_scores: torch.Tensor,
    rows: Sequence[Row | None],
    instances: int,
    readable: torch.Tensor,
    start_map: Sequence[int],
    end_map: Sequence[int],
    budget: int,
) -> torch.Tensor:
    """span_scores ([instances, fields, prompt and text words, width]) with every text candidate masked (NaN) but the
    spans the answer shows, within `budget` (module docstring); `readable`: readable_spans of the text."""
    words = len(start_map)
    if words == 0 or span_scores.numel() == 0:
        return span_scores
    scores = span_scores[:instances, :, -words:, :]
    count, fields, _, width = scores.shape
    device = scores.device
    thresholds = torch.tensor(
        [row.threshold if row else float("inf") for row in rows], dtype=scores.dtype, device=device
    )
    passing = (scores >= thresholds[:fields, None, None]) & readable[:, :width].to(device)
    single = torch.tensor([bool(row and row.single) for row in rows], dtype=torch.bool, device=device)[:fields]
    keep = torch.zeros_like(passing)
    _keep_best(scores, passing & single[None, :, None, None], keep)
    _keep_greedy(scores, passing & ~single[None, :, None, None], keep, start_map, end_map, budget)
    masked = span_scores.clone()
    masked[:count, :, -words:, :] = scores.masked_fill(~keep, float("nan"))
    masked[count:, :, -words:, :] = float("nan")
    return masked


def _keep_best(scores: torch.Tensor, candidates: torch.Tensor, keep: torch.Tensor) -> None:
    """Each row's best candidate (the first of ties, as GLiNER2's stable ranking has it)."""
    count, fields, words, width = scores.shape
    flat = scores.masked_fill(~candidates, float("-inf")).reshape(count, fields, words * width)
    best = flat.argmax(dim=-1, keepdim=True)
    found = candidates.reshape(count, fields, words * width).any(dim=-1, keepdim=True)
    keep.view(count, fields, words * width).scatter_(-1, best, found)


def _keep_greedy(
    scores: torch.Tensor,
    candidates: torch.Tensor,
    keep: torch.Tensor,
    start_map: Sequence[int],
    end_map: Sequence[int],
    budget: int,
) -> None:
    """GLiNER2's greedy pass over the candidates of every row together, best first, until `budget` spans are kept."""
    words, width = scores.shape[-2:]
    flat_candidates = candidates.reshape(-1)
    total = int(flat_candidates.sum())
    if total == 0:
        return
    flat = scores.reshape(-1).masked_fill(~flat_candidates, float("-inf"))
    needed = budget * (1 + (2 * width - 1) * width)
    if total > needed:
        # The first `needed` of GLiNER2's ranking: every score above the needed-th, then its ties in index order.
        floor = flat.topk(needed).values[-1]
        above = torch.nonzero(flat > floor).flatten()
        ties = torch.nonzero(flat == floor).flatten()[: needed - len(above)]
        indices = torch.cat((above, ties)).sort().values
    else:
        indices = torch.nonzero(flat_candidates).flatten()
    ranked = indices[torch.sort(flat[indices], descending=True, stable=True).indices].tolist()
    kept_starts: dict[int, list[int]] = {}
    kept_ends: dict[int, list[int]] = {}
    kept = 0
    flat_keep = keep.view(-1)
    for index in ranked:
        row, place = divmod(index, words * width)
        start, extra = divmod(place, width)
        char_start, char_end = start_map[start], end_map[start + extra]
        starts = kept_starts.setdefault(row, [])
        ends = kept_ends.setdefault(row, [])
        after = bisect.bisect_right(ends, char_start)
        if after < len(starts) and starts[after] < char_end:
            continue  # overlaps a span kept before it in its row
        starts.insert(after, char_start)
        ends.insert(after, char_end)
        flat_keep[index] = True
        kept += 1
        if kept == budget:
            return


class SpanBudget:
    """Installed on a loaded GLiNER2 (span architecture): its span decoding, each task's, keeps within `spans`, set
    for each batch before it runs."""

    def __init__(self, extractor: Any) -> None:
        self.spans = DEFAULT_MAX_SPANS
        self._decode = extractor._decode_span_probabilities
        self._width = int(extractor.config.max_width)
        # The last text's readable_spans (GLiNER2 decodes a text's tasks one after the other), by its word starts.
        self._readable: tuple[list[int], torch.Tensor] | None = None
        extractor._decode_span_probabilities = self._decode_within

    def _decode_within(
        self,
        results: dict[str, Any],
        schema_name: str,
        task_type: str,
        field_names: list[str],
        span_scores: torch.Tensor,
        raw_logits: torch.Tensor,
        pred_count: int,
        text_len: int,
        text_tokens: list[str],
        original_text: str,
        start_mapping: list[int],
        end_mapping: list[int],
        threshold: float,
        metadata: dict[str, Any],
        cls_fields: dict[str, Any],
        include_confidence: bool,
        include_spans: bool,
    ) -> None:
        rows = task_rows(schema_name, task_type, field_names, threshold, metadata, cls_fields)
        instances = 1 if schema_name == "entities" else pred_count
        if self._readable is None or self._readable[0] is not start_mapping:
            self._readable = (start_mapping, readable_spans(original_text, start_mapping, end_mapping, self._width))
        readable = self._readable[1]
        masked = keep_within(span_scores, rows, instances, readable, start_mapping, end_mapping, self.spans)
        self._decode(
            results,
            schema_name,
            task_type,
            field_names,
            masked,
            raw_logits,
            pred_count,
            text_len,
            text_tokens,
            original_text,
            start_mapping,
            end_mapping,
            threshold,
            metadata,
            cls_fields,
            include_confidence,
            include_spans,
        )
