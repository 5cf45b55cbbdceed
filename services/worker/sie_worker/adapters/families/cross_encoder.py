"""Cross-encoder rerankers: a sequence-classification head over (query, item) pairs.

The score is the single logit through the model's activation, as
sentence-transformers' CrossEncoder chooses it: the `activation_fn` saved in
config_sentence_transformers.json (sentence-transformers 6), in config.json
under `sentence_transformers`, or as config.json's older
`sbert_ce_default_activation_function` (Sigmoid, Identity or Tanh), else
Sigmoid for one label. load_options `activation` (`sigmoid` / `identity` /
`tanh`) overrides it. Models with more than one label are refused at load.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import AutoModelForSequenceClassification

from sie_worker.adapters.base import LoadContext, PairScorer, TokenizedText
from sie_worker.adapters.hf import load_model
from sie_worker.adapters.layers.activations import ACTIVATIONS, saved_activation
from sie_worker.adapters.layers.padding import by_length, model_inputs, padded
from sie_worker.adapters.layers.text_tokenizer import TextTokenizer


class CrossEncoderScorer(PairScorer):
    tasks = ("score",)
    output_types: tuple[str, ...] = ()
    dims = 0

    def __init__(self, context: LoadContext) -> None:
        self.model = load_model(AutoModelForSequenceClassification, context, reads_padding=False)
        if self.model.config.num_labels != 1:
            raise ValueError(f"a reranker needs one output label; this model has {self.model.config.num_labels}")
        self.device = context.device
        self.tokenizer = TextTokenizer(
            context.weights,
            context.config.max_sequence_length,
            self.model,
            trust_remote_code=context.profile.trust_remote_code,
        )
        self.max_sequence_length = self.tokenizer.max_length
        activation = context.profile.load_options.get("activation") or saved_activation(context.weights)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation]

    def tokenize_pairs(self, query: str, texts: Sequence[str], instruction: str | None = None) -> list[TokenizedText]:
        return self.tokenizer.encode_pairs((instruction or "") + query, texts)

    def score(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        return np.array(by_length(batch, self.device, self._score), dtype=np.float32)

    def _score(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        with torch.inference_mode():
            logits = self.model(**model_inputs(self.model, inputs)).logits.float()[:, 0]
            return self.activation(logits).cpu().numpy()
