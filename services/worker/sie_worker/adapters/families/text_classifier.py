"""Text classifiers with labels of their own (sentiment, topic, toxicity, emotions): a sequence-classification head
(`AutoModelForSequenceClassification`) over each text, its labels scored as transformers' text-classification
pipeline scores them: a sigmoid per label for a multi-label model (`problem_type: multi_label_classification`) or a
model of one label, else a softmax across the labels. Every label comes back, best first; a request's threshold
leaves out those scored below it. A text is truncated at the model's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Classification, Extraction, TokenizedText
from sie_worker.adapters.layers.activations import softmax
from sie_worker.adapters.layers.padding import by_length, model_inputs, padded
from sie_worker.adapters.spec import AdapterSpec


class TextClassifier(HfAdapter):
    spec = AdapterSpec("text_classifier", tasks=("extract",))
    model: PreTrainedModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        self.model = self.load(AutoModelForSequenceClassification, reads_padding=False)
        config = self.model.config
        # transformers types id2label as it may be given; a loaded model's config has int keys for every label.
        self.labels = [config.id2label[index] for index in range(config.num_labels)]  # type: ignore[index, arg-type]
        self.multi_label = config.problem_type == "multi_label_classification" or config.num_labels == 1
        self.tokenizer = self.use_tokenizer(self.model)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        tokenized = self.tokenizer.encode([item.text or "" for item in items])
        return [Prepared(item, len(item.ids)) for item in tokenized]

    def run(self, batch: Sequence[TokenizedText], query: Query) -> list[np.ndarray]:
        """Each text's logits, one per label."""
        return by_length(batch, self.device, self._logits)

    def _logits(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        return self.model(**model_inputs(self.model, inputs)).logits.float().cpu().numpy()

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        logits = np.asarray(output, dtype=np.float64)
        scores = 1 / (1 + np.exp(-logits)) if self.multi_label else softmax(logits)
        order = sorted(range(len(scores)), key=lambda index: -scores[index])
        return Extraction(
            classifications=[
                Classification(label=self.labels[index], score=float(scores[index]))
                for index in order
                if query.threshold is None or scores[index] >= query.threshold
            ]
        )
