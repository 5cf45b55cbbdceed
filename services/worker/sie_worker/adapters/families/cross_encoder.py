"""Cross-encoder rerankers: a sequence-classification head over (query, item) pairs.

The score is the single logit through the model's activation, as
sentence-transformers' CrossEncoder chooses it: the `activation_fn` saved in
config_sentence_transformers.json (sentence-transformers 6), in config.json
under `sentence_transformers`, or as config.json's older
`sbert_ce_default_activation_function` (Sigmoid, Identity or Tanh), else
Sigmoid for one label. load_options `activation` (`sigmoid` / `identity` /
`tanh`) overrides it. Models with more than one label are refused at load.
A checkpoint of shipped code served natively (sie_worker.adapters.layers.native_architectures: jinaai's XLM-RoBERTa
with absolute positions) loads through transformers' own class unless the profile trusts the shipped code.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from transformers import AutoModelForSequenceClassification

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import TokenizedText
from sie_worker.adapters.layers.activations import ACTIVATIONS, saved_activation
from sie_worker.adapters.layers.native_architectures import serving_class
from sie_worker.adapters.layers.padding import by_length, model_inputs, padded
from sie_worker.adapters.spec import AdapterSpec


class CrossEncoderScorer(HfAdapter):
    spec = AdapterSpec("cross_encoder", tasks=("score",), pairs=True)

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        classifier = serving_class(
            AutoModelForSequenceClassification, context.weights, trusted=context.profile.trust_remote_code
        )
        self.model = self.load(classifier, reads_padding=False)
        if self.model.config.num_labels != 1:
            raise ValueError(f"a reranker needs one output label; this model has {self.model.config.num_labels}")
        self.tokenizer = self.use_tokenizer(self.model)
        activation = context.profile.load_options.get("activation") or saved_activation(context.weights)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation]

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        """Each (query, item) pair as one sequence, the instruction before the query."""
        first = (query.instruction or "") + (items[0].pair or "") if items else ""
        tokenized = self.tokenizer.encode_pairs(first, [item.text or "" for item in items])
        return [Prepared(item, len(item.ids)) for item in tokenized]

    def run(self, batch: Sequence[TokenizedText], query: Query) -> np.ndarray:
        return np.array(by_length(batch, self.device, self._score), dtype=np.float32)

    def _score(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        logits = self.model(**model_inputs(self.model, inputs)).logits.float()[:, 0]
        return self.activation(logits).cpu().numpy()
