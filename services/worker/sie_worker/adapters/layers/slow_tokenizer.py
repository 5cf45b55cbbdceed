"""Tokenizers that only exist in Python (no Rust `tokenizers` backend), such as SigLIP's SentencePiece one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from sie_worker.adapters.items import TokenizedText
from sie_worker.adapters.layers.text_tokenizer import PREFIX_CHARS_PER_TOKEN, TextTokenizer, max_length


class SlowTextTokenizer:
    """A Python tokenizer (SiglipTokenizer over `spiece.model`: lowercased, punctuation removed), truncating to the
    model's maximum length. Thread-safe: SentencePiece encoding keeps no state between calls."""

    def __init__(self, hf: Any, configured_max_length: int | None, model: Any) -> None:
        self.hf = hf
        self.max_length = max_length(configured_max_length, {}, hf, model)
        self.pad_id: int = hf.pad_token_id if hf.pad_token_id is not None else 0

    def encode(self, texts: Sequence[str]) -> list[TokenizedText]:
        return [
            TokenizedText(self.hf(self._prefix(text), truncation=True, max_length=self.max_length)["input_ids"])
            for text in texts
        ]

    def _prefix(self, text: str) -> str:
        """The text cut at a space where its first words already give more tokens than the maximum length (the
        rest would be truncated away): a long text costs what the model reads of it. The pieces of a word never
        reach across a space, so the cut leaves the kept tokens as they are.

        A text with no such space (one 2 MiB word, CJK, words joined by tabs or punctuation) took seconds per item
        read whole in Python: it is cut inside its run of characters instead, where a prefix already gives more
        tokens than the maximum length and a prefix twice as long keeps the same ones (the pieces chosen for the
        start of a run do not change with characters far past the kept ones)."""
        length = self.max_length * PREFIX_CHARS_PER_TOKEN
        while length < len(text):
            cut = text.rfind(" ", 0, length)
            if cut > 0 and len(self.hf(text[:cut])["input_ids"]) > self.max_length:
                return text[:cut]
            if 2 * length < len(text) and self._settled(text, length):
                return text[:length]
            length *= 4
        return text

    def _settled(self, text: str, length: int) -> bool:
        """Whether text[:length] has more tokens than the maximum length and keeps the ones text[: 2 * length] keeps."""
        ids = self.hf(text[:length])["input_ids"]
        if len(ids) <= self.max_length:
            return False
        kept = self.hf(text[:length], truncation=True, max_length=self.max_length)["input_ids"]
        return kept == self.hf(text[: 2 * length], truncation=True, max_length=self.max_length)["input_ids"]


def text_tokenizer(
    directory: Path, configured_max_length: int | None, model: Any, *, trust_remote_code: bool = False
) -> TextTokenizer | SlowTextTokenizer:
    """The model's tokenizer: Rust-backed where transformers has one, else its Python implementation."""
    hf = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    if hf.is_fast:
        return TextTokenizer(directory, configured_max_length, model, hf=hf, trust_remote_code=trust_remote_code)
    return SlowTextTokenizer(hf, configured_max_length, model)
