"""Token-classification extractors (NER): per-token labels merged into character spans.

Merging follows the BIO/IOB convention: `B-X` starts an entity of type X,
`I-X` continues an X entity (and starts one after anything else), a label
without prefix continues a run of the same label, `O` is outside. An entity's
score is the mean probability of its tokens' labels; its text is exactly
text[start:end] of the original item. Special tokens never join a span.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForTokenClassification

from sie_worker.adapters.base import (
    Entity,
    ExtractInput,
    Extraction,
    ExtractQuery,
    ItemExtractor,
    LoadContext,
    Prepared,
    TokenizedText,
)
from sie_worker.adapters.hf import load_model
from sie_worker.adapters.layers.padding import model_inputs, padded
from sie_worker.adapters.layers.text_tokenizer import TextTokenizer


class TokenClassificationExtractor(ItemExtractor):
    tasks = ("extract",)
    zero_shot = False
    output_types: tuple[str, ...] = ()
    dims = 0

    def __init__(self, context: LoadContext) -> None:
        self.model = load_model(AutoModelForTokenClassification, context)
        self.device = context.device
        self.tokenizer = TextTokenizer(
            context.weights,
            context.config.max_sequence_length,
            self.model,
            trust_remote_code=context.profile.trust_remote_code,
        )
        self.max_sequence_length = self.tokenizer.max_length
        # transformers types id2label as it may be given (str keys, or none) and num_labels as optional; a loaded
        # model's config has both, with int keys.
        self.labels = [self.model.config.id2label[index] for index in range(self.model.config.num_labels)]  # type: ignore[index, arg-type]

    def check_query(self, query: ExtractQuery) -> None:
        """The model's own labels are the ones it finds: labels in the request are ignored."""

    def prepare(self, item: ExtractInput, query: ExtractQuery) -> Prepared:
        tokens = self.tokenizer.encode([item.text or ""])[0]
        return Prepared(tokens, len(tokens.ids))

    def run(self, batch: Sequence[Any], query: ExtractQuery) -> list[Any]:
        """Per item, label probabilities [tokens, labels]."""
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        with torch.inference_mode():
            probabilities = self.model(**model_inputs(self.model, inputs)).logits.float().softmax(dim=-1).cpu().numpy()
        return [probabilities[row, : len(item.ids)] for row, item in enumerate(batch)]

    def finish(self, item: ExtractInput, prepared: Any, output: Any, query: ExtractQuery) -> Extraction:
        return Extraction(entities=self.entities(item.text or "", prepared, output, query.threshold))

    def entities(
        self, text: str, tokens: TokenizedText, probabilities: np.ndarray, threshold: float | None
    ) -> list[Entity]:
        """Merged spans of one item."""
        best = probabilities.argmax(axis=-1)
        groups: list[tuple[str, list[int]]] = []  # (type, token positions)
        previous: tuple[str, str] | None = None
        for position, token in enumerate(tokens.ids):
            if token in self.tokenizer.special_ids:
                previous = None
                continue
            tag, kind = _split(self.labels[best[position]])
            if previous is not None and kind == previous[1] and tag != "B":
                groups[-1][1].append(position)
            else:
                groups.append((kind, [position]))
            previous = (tag, kind)
        entities = []
        for kind, positions in groups:
            if kind == "O":
                continue
            score = float(np.mean([probabilities[position, best[position]] for position in positions]))
            if threshold is not None and score < threshold:
                continue
            start, end = tokens.offsets[positions[0]][0], tokens.offsets[positions[-1]][1]
            entities.append(Entity(text=text[start:end], label=kind, score=score, start=start, end=end))
        return entities


def _split(label: str) -> tuple[str, str]:
    """("B" | "I", entity type); a bare label such as "O" or "PER" counts as a continuation."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label
