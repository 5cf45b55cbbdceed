"""ColBERT-style multivector encoders: one projected, L2-normalized vector per token.

Directory: a `transformers` encoder plus a linear projection in the layout
PyLate uses (a `Dense` entry in modules.json whose folder holds
model.safetensors with `linear.weight`). Query and document marker tokens go
right after the first token ([CLS]). load_options:

- `query_marker` / `document_marker`: marker tokens (default `[unused0]` / `[unused1]`, as ColBERTv2);
- `query_length` (default 32): queries are cut to it and, with `query_expansion` (default true),
  padded to it with [MASK] tokens, which the encoder attends to only with
  `attend_to_expansion_tokens` (default false); every query position yields a vector;
- `mask_punctuation` (default true): document vectors of punctuation tokens are dropped;
  document padding is always dropped.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence

import torch
from safetensors.torch import load_file
from transformers import AutoModel

from sie_worker.adapters.base import EncodedItem, LoadContext, TextEncoder, TokenizedText
from sie_worker.adapters.hf_text import TextTokenizer, load_model, model_inputs, padded


class ColbertEncoder(TextEncoder):
    tasks = ("encode", "score")
    output_types = ("multivector",)
    normalized = True

    def __init__(self, context: LoadContext) -> None:
        directory = context.weights
        options = dict(context.profile.load_options)
        self.model = load_model(AutoModel, context)
        self.device = context.device
        # One position is reserved for the marker token.
        self.tokenizer = TextTokenizer(directory, context.config.max_sequence_length, self.model, reserve=1, trust_remote_code=context.profile.trust_remote_code)
        self.max_sequence_length = self.tokenizer.max_length
        vocab = self.tokenizer.rust
        self.query_marker = _token_id(vocab, options.get("query_marker", "[unused0]"))
        self.document_marker = _token_id(vocab, options.get("document_marker", "[unused1]"))
        self.mask_id = _token_id(vocab, self.tokenizer.hf.mask_token or "[MASK]")
        self.query_length = int(options.get("query_length", 32))
        self.query_expansion = bool(options.get("query_expansion", True))
        self.attend_to_expansion = bool(options.get("attend_to_expansion_tokens", False))
        punctuation = [vocab.token_to_id(symbol) for symbol in string.punctuation] if options.get("mask_punctuation", True) else []
        self.skip_ids = {token for token in punctuation if token is not None}
        self.projection = _projection(directory).to(device=context.device, dtype=context.dtype)
        self.multivector_dims = self.projection.shape[0]
        self.dims = 0

    def prompt(self, *, is_query: bool, instruction: str | None) -> str:
        return instruction or ""

    def tokenize(self, texts: Sequence[str], prompt: str, *, is_query: bool = False) -> list[TokenizedText]:
        marker = self.query_marker if is_query else self.document_marker
        items = []
        for encoded in self.tokenizer.encode([prompt + text for text in texts]):
            ids = [*encoded.ids[:1], marker, *encoded.ids[1:]]
            if is_query:
                if len(ids) > self.query_length:
                    ids = [*ids[: self.query_length - 1], ids[-1]]
                if self.query_expansion:
                    ids += [self.mask_id] * (self.query_length - len(ids))
            items.append(TokenizedText(ids, is_query=is_query))
        return items

    def encode(self, batch: Sequence[TokenizedText], output_types: Sequence[str]) -> list[EncodedItem]:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        attention = inputs["attention_mask"].clone()
        if not self.attend_to_expansion:
            for row, item in enumerate(batch):
                if item.is_query:
                    attention[row, _real_length(item.ids, self.mask_id) :] = 0
        with torch.inference_mode():
            hidden = self.model(**model_inputs(self.model, {**inputs, "attention_mask": attention})).last_hidden_state
            vectors = torch.nn.functional.normalize(hidden @ self.projection.T, p=2, dim=-1).float().cpu().numpy()
        items = []
        for row, item in enumerate(batch):
            keep = [
                position
                for position, token in enumerate(item.ids)
                if item.is_query or token not in self.skip_ids
            ]
            items.append(EncodedItem(multivector=vectors[row, keep]))
        return items


def _real_length(ids: Sequence[int], mask_id: int) -> int:
    """Tokens before the trailing [MASK] expansion."""
    length = len(ids)
    while length and ids[length - 1] == mask_id:
        length -= 1
    return length


def _token_id(tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary")
    return token_id


def _projection(directory) -> torch.Tensor:
    """The `linear.weight` [out, hidden] of the Dense module listed in modules.json."""
    modules_file = directory / "modules.json"
    entries = json.loads(modules_file.read_text()) if modules_file.exists() else []
    dense = next((entry for entry in entries if entry["type"].endswith("Dense")), None)
    if dense is None:
        raise ValueError(f"{modules_file}: no Dense module: a ColBERT model needs its projection")
    weights = load_file(str(directory / dense["path"] / "model.safetensors"))
    if "linear.weight" not in weights:
        raise ValueError(f"{directory / dense['path']}: model.safetensors has no 'linear.weight'")
    return weights["linear.weight"]
