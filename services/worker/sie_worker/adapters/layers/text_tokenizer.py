"""A model's text tokenizer as the adapters use it: truncating, unpadded, thread-safe, reading a long text only as
far as the model does; and the model's length limit (its config, sentence-transformers files, tokenizer and position
table)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from sie_worker.adapters.items import TokenizedText
from sie_worker.adapters.layers.checkpoint_files import read_json

log = logging.getLogger(__name__)

# Characters of a text tokenized at first per token of the maximum length (TextTokenizer._encode_prefixes).
PREFIX_CHARS_PER_TOKEN = 4
# Characters per token of the maximum length past which a prefix is not grown further: its kept tokens then stand
# for the whole text's (a vocabulary's tokens are far shorter), even when one word runs on past it. Not read: what
# follows that many characters when they give fewer tokens than the maximum length (mostly whitespace).
MAX_PREFIX_CHARS_PER_TOKEN = 64
# Above this, a tokenizer's model_max_length is a placeholder, not a limit.
_UNSET_MAX_LENGTH = 1_000_000


class TextTokenizer:
    """A model's tokenizer, configured once for truncation and no padding.

    Holds a private copy of the Rust tokenizer: encode_batch on it mutates
    nothing, so the preprocessing threads can share it.
    """

    def __init__(
        self,
        directory: Path,
        configured_max_length: int | None,
        model: Any,
        *,
        reserve: int = 0,
        trust_remote_code: bool = False,
        hf: Any = None,
        add_special_tokens: bool = True,
    ) -> None:
        # `hf`: the directory's tokenizer when the caller has loaded it already. `add_special_tokens`: false for the
        # text's own tokens alone (no [CLS] / [SEP] around them), truncated at the same length.
        self.hf = (
            hf if hf is not None else AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
        )
        st_config = read_json(directory / "sentence_bert_config.json")
        self.max_length = max_length(configured_max_length, st_config, self.hf, model)
        self.lowercase = bool(st_config.get("do_lower_case", False))
        self.pad_id: int = self.hf.pad_token_id if self.hf.pad_token_id is not None else 0
        self.special_ids = set(self.hf.all_special_ids)
        self.rust = Tokenizer.from_str(self.hf.backend_tokenizer.to_str())
        self.rust.no_padding()
        self.add_special_tokens = add_special_tokens
        # `reserve` leaves room for tokens an adapter inserts itself (markers).
        self.rust.enable_truncation(self.max_length - reserve, direction=self.hf.truncation_side)

    def encode(self, texts: Sequence[str]) -> list[TokenizedText]:
        inputs = [text.lower() for text in texts] if self.lowercase else list(texts)
        return [
            TokenizedText(encoding.ids, type_ids=encoding.type_ids, offsets=list(encoding.offsets))
            for encoding in self._encode_prefixes(inputs)
        ]

    def _encode_prefixes(self, texts: list[str], *, chunks: int = 1) -> list[Any]:
        """The truncated encodings of `texts`, each tokenized only as far as its first `chunks` chunks of the
        maximum length (the kept tokens, then the overflowing ones) need.

        The tokenizer reads a whole text before truncating it: 14 MB of short words took 30 s and 2 GB. So a
        text is tokenized from a prefix of PREFIX_CHARS_PER_TOKEN characters per token of the maximum length
        and chunk, four times longer each time that prefix does not show those chunks to be final: there must
        be more tokens, and none of theirs may belong to the prefix's last word (which the cut may have split).
        Then they are the whole text's. A prefix stops growing at MAX_PREFIX_CHARS_PER_TOKEN characters per
        token and chunk: one "word" of megabytes (a run of letters no pre-tokenizer splits) would otherwise be read
        whole, seconds and gigabytes for tokens past the cut. Texts the tokenizer truncates on the left are read
        whole."""
        if self.rust.truncation is None or self.rust.truncation["direction"] != "right":
            return self.rust.encode_batch(texts, add_special_tokens=self.add_special_tokens)
        length = self.max_length * PREFIX_CHARS_PER_TOKEN * chunks
        encodings = self.rust.encode_batch(
            [text[:length] for text in texts], add_special_tokens=self.add_special_tokens
        )
        pending = [
            index
            for index, text in enumerate(texts)
            if len(text) > length and not _chunks_final(encodings[index], chunks)
        ]
        longest = self._longest_prefix(chunks)
        while pending and length < longest:
            length = min(length * 4, longest)
            for index, encoding in zip(
                pending,
                self.rust.encode_batch(
                    [texts[index][:length] for index in pending], add_special_tokens=self.add_special_tokens
                ),
                strict=True,
            ):
                encodings[index] = encoding
            pending = [
                index for index in pending if len(texts[index]) > length and not _chunks_final(encodings[index], chunks)
            ]
        return encodings

    def _longest_prefix(self, chunks: int) -> int:
        """The most characters of a text `_encode_prefixes` reads for `chunks` chunks."""
        return self.max_length * MAX_PREFIX_CHARS_PER_TOKEN * chunks

    def encode_pairs(self, first: str, seconds: Sequence[str]) -> list[TokenizedText]:
        """(first, second) pairs, truncated longest first. Each text is cut first to the tokens a pair can keep
        of it: every pair tokenizes `first` again, so a long query costs one tokenization, not one per item, and
        a long item costs what the pair reads of it."""
        if self.lowercase:  # the query once, not once per pair
            first, seconds = first.lower(), [text.lower() for text in seconds]
        first = self.readable_prefixes([first])[0]
        pairs = list(zip([first] * len(seconds), self.readable_prefixes(list(seconds)), strict=True))
        return [TokenizedText(encoding.ids, type_ids=encoding.type_ids) for encoding in self.rust.encode_batch(pairs)]

    def readable_prefixes(self, texts: list[str]) -> list[str]:
        """Each text cut after about twice the maximum length in tokens (all of it when it fits, but never past
        what `_encode_prefixes` reads: a text whose read prefix gives fewer tokens, mostly whitespace, is cut
        there, or every pair would read it whole again). Cut longer than the maximum length, a text truncates in
        a pair (longest first) as the whole text does, except when both are cut: then the odd token of the
        budget may go to the other side (the longer one gets it)."""
        longest = self._longest_prefix(2)
        return [
            text[: max(end for _, end in encoding.overflowing[0].offsets)] if encoding.overflowing else text[:longest]
            for text, encoding in zip(texts, self._encode_prefixes(texts, chunks=2), strict=True)
        ]


def _chunks_final(encoding: Any, chunks: int) -> bool:
    """Whether a truncated encoding of a text's prefix has the first `chunks` chunks the whole text would: more
    tokens follow them, and none of theirs belongs to the prefix's last word."""
    if len(encoding.overflowing) < chunks:
        return False
    words = [
        word for chunk in (encoding, *encoding.overflowing[: chunks - 1]) for word in chunk.word_ids if word is not None
    ]
    last = [word for word in encoding.overflowing[-1].word_ids if word is not None]
    return bool(words) and bool(last) and max(words) < last[-1]


def max_length(configured: int | None, st_config: dict[str, Any], tokenizer: Any, model: Any) -> int:
    """The model YAML wins, then sentence_bert_config.json, then the tokenizer, then the position table; never
    more than the position table holds (a longer input would fail the forward pass of its whole batch)."""
    limit = position_limit(model)
    for candidate in (configured, st_config.get("max_seq_length"), tokenizer.model_max_length):
        if isinstance(candidate, int) and 0 < candidate < _UNSET_MAX_LENGTH:
            if limit is not None and candidate > limit:
                log.warning(
                    "max sequence length %d is more than the model's %d positions; truncating at %d",
                    candidate,
                    limit,
                    limit,
                )
                return limit
            return candidate
    return int(model.config.max_position_embeddings) if limit is None else limit


def position_limit(model: Any, *, table_only: bool = False) -> int | None:
    """Longest sequence the model can position: the rows of its learned position table (less the padding offset
    RoBERTa-style tables reserve), else (unless `table_only`) its config's max_position_embeddings; None when it
    says nothing."""
    table = _position_table(model)
    if table is not None:
        return table.num_embeddings - position_offset(model)
    if table_only:
        return None
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None


def position_offset(model: Any) -> int:
    """Position id of a sequence's first token: RoBERTa-style learned tables reserve their first padding_idx + 1
    rows (the model counts from there when it makes position ids itself); 0 for every other model."""
    table = _position_table(model)
    return table.padding_idx + 1 if table is not None and table.padding_idx is not None else 0


def _position_table(model: Any) -> torch.nn.Embedding | None:
    for name, module in model.named_modules():
        if name.endswith("position_embeddings") and isinstance(module, torch.nn.Embedding):
            return module
    return None
