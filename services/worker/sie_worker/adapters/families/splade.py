"""SPLADE-style sparse encoders: a masked-LM head read as vocabulary weights.

weight[v] = max over the item's tokens of log(1 + relu(logit[token, v])), padding excluded (a
sentence-transformers SpladePooling may say `sum` instead of max, or `log1p_relu`: log(1 + log(1 + relu))).
Doc-only models (OpenSearch) weigh queries without the model: each distinct token of the query (tokenized with no
special tokens added; an unknown character's [UNK] counts) gets its static weight from `idf.json` / the
SparseStaticEmbedding (sie_worker.adapters.layers.sparse_layout), as sentence-transformers' SparseStaticEmbedding.
The non-zero weights come back as ascending indices + values.
A masked-LM of a shipped model type served natively (sie_worker.adapters.layers.native_architectures: new-impl's GTE)
loads through transformers' own class unless the profile trusts the shipped code.
run_options `query_prompt` / `document_prompt` put a prefix before the text (a request's instruction replaces it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from transformers import AutoModelForMaskedLM

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, SparseWeights, TokenizedText
from sie_worker.adapters.layers.native_architectures import serving_class
from sie_worker.adapters.layers.padding import model_inputs, padded
from sie_worker.adapters.layers.sparse_layout import read_layout
from sie_worker.adapters.layers.text_tokenizer import TextTokenizer
from sie_worker.adapters.spec import AdapterSpec


class SpladeEncoder(HfAdapter):
    spec = AdapterSpec("splade", tasks=("encode",), outputs=("sparse",))

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        self.layout = read_layout(context.weights)
        directory = self.layout.model_directory
        masked_lm = serving_class(AutoModelForMaskedLM, directory, trusted=context.profile.trust_remote_code)
        self.model = self.load(masked_lm, weights=directory)
        self.tokenizer = self.use_tokenizer(self.model, directory=directory)
        self.vocab_size = int(self.model.config.vocab_size)
        if self.layout.idf is not None:
            # Tokens past the model's vocabulary are no dimension of the answer (nor of any document's weights).
            self.layout = dataclasses.replace(self.layout, idf=self.layout.idf[: self.vocab_size])
            # Static query weights read the query's own tokens (no [CLS] / [SEP] added), every one of them, [UNK]
            # included, up to the length limit: sentence-transformers' SparseStaticEmbedding.
            self.query_tokenizer = TextTokenizer(
                directory,
                context.config.max_sequence_length,
                self.model,
                trust_remote_code=context.profile.trust_remote_code,
                add_special_tokens=False,
            )
        run_options = context.profile.run_options
        self.query_prompt = run_options.get("query_prompt", "")
        self.document_prompt = run_options.get("document_prompt", "")

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        prompt = self.prompt(query)
        texts = [prompt + (item.text or "") for item in items]
        if query.is_query and self.layout.idf is not None:
            tokenized = [TokenizedText(item.ids, is_query=True) for item in self.query_tokenizer.encode(texts)]
        else:
            tokenized = self.tokenizer.encode(texts)
        return [Prepared(item, len(item.ids)) for item in tokenized]

    def run(self, batch: Sequence[TokenizedText], query: Query) -> list[EncodedItem]:
        idf = self.layout.idf
        items = {row: self._static(item, idf) for row, item in enumerate(batch) if item.is_query and idf is not None}
        modelled = [row for row in range(len(batch)) if row not in items]
        if modelled:
            for row, pooled in zip(modelled, self._pooled([batch[row] for row in modelled]), strict=True):
                indices = np.flatnonzero(pooled > 0).astype(np.uint32)
                items[row] = EncodedItem(
                    sparse=SparseWeights(indices, pooled[indices].astype(np.float32), self.vocab_size)
                )
        return [items[row] for row in range(len(batch))]

    def _pooled(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        """Vocabulary weights [items, vocabulary] from one forward pass."""
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        logits = self.model(**model_inputs(self.model, inputs)).logits.float()
        weights = torch.log1p(torch.relu(logits))
        if self.layout.activation == "log1p_relu":
            weights = torch.log1p(weights)
        weights = weights * inputs["attention_mask"].unsqueeze(-1)
        pooled = weights.max(dim=1).values if self.layout.pooling == "max" else weights.sum(dim=1)
        return pooled.cpu().numpy()

    def _static(self, item: TokenizedText, idf: np.ndarray) -> EncodedItem:
        """A query's static weights: each distinct token's idf weight (its text's own tokens: [UNK] too)."""
        ids = sorted({token for token in item.ids if token < len(idf)})
        indices = np.array([token for token in ids if idf[token] != 0], dtype=np.uint32)
        return EncodedItem(sparse=SparseWeights(indices, idf[indices].astype(np.float32), self.vocab_size))
