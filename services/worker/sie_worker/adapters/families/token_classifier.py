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
from transformers import AutoModelForTokenClassification

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Entity, Extraction, TokenizedText
from sie_worker.adapters.layers.padding import model_inputs, padded
from sie_worker.adapters.spec import AdapterSpec


class TokenClassificationExtractor(HfAdapter):
    spec = AdapterSpec("token_classifier", tasks=("extract",))

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        self.model = self.load(AutoModelForTokenClassification)
        self.tokenizer = self.use_tokenizer(self.model)
        # transformers types id2label as it may be given (str keys, or none) and num_labels as optional; a loaded
        # model's config has both, with int keys.
        self.labels = [self.model.config.id2label[index] for index in range(self.model.config.num_labels)]  # type: ignore[index, arg-type]

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        tokens = self.tokenizer.encode([item.text or ""])[0]
        return Prepared(tokens, len(tokens.ids))

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per item, label probabilities [tokens, labels]."""
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        probabilities = self.model(**model_inputs(self.model, inputs)).logits.float().softmax(dim=-1).cpu().numpy()
        return [probabilities[row, : len(item.ids)] for row, item in enumerate(batch)]

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
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
