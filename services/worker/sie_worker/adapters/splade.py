"""SPLADE-style sparse encoders: a masked-LM head read as vocabulary weights.

weight[v] = max over the item's tokens of log(1 + relu(logit[token, v])),
padding excluded. The non-zero weights come back as ascending indices + values.
run_options `query_prompt` / `document_prompt` put a prefix before the text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import AutoModelForMaskedLM

from sie_worker.adapters.base import EncodedItem, LoadContext, SparseWeights, TextEncoder, TokenizedText
from sie_worker.adapters.hf_text import TextTokenizer, load_model, model_inputs, padded


class SpladeEncoder(TextEncoder):
    tasks = ("encode",)
    output_types = ("sparse",)
    normalized = False

    def __init__(self, context: LoadContext) -> None:
        self.model = load_model(AutoModelForMaskedLM, context)
        self.device = context.device
        self.tokenizer = TextTokenizer(context.weights, context.config.max_sequence_length, self.model, trust_remote_code=context.profile.trust_remote_code)
        self.max_sequence_length = self.tokenizer.max_length
        self.vocab_size = int(self.model.config.vocab_size)
        self.dims = 0
        run_options = context.profile.run_options
        self.query_prompt: str = run_options.get("query_prompt", "")
        self.document_prompt: str = run_options.get("document_prompt", "")

    def prompt(self, *, is_query: bool, instruction: str | None) -> str:
        if instruction is not None:
            return instruction
        return self.query_prompt if is_query else self.document_prompt

    def tokenize(self, texts: Sequence[str], prompt: str, *, is_query: bool = False) -> list[TokenizedText]:
        return self.tokenizer.encode([prompt + text for text in texts])

    def encode(self, batch: Sequence[TokenizedText], output_types: Sequence[str]) -> list[EncodedItem]:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        with torch.inference_mode():
            logits = self.model(**model_inputs(self.model, inputs)).logits.float()
            weights = torch.log1p(torch.relu(logits)) * inputs["attention_mask"].unsqueeze(-1)
            pooled = weights.max(dim=1).values.cpu().numpy()
        items = []
        for row in pooled:
            indices = np.flatnonzero(row > 0).astype(np.uint32)
            items.append(EncodedItem(sparse=SparseWeights(indices, row[indices].astype(np.float32), self.vocab_size)))
        return items
