"""A text's tokens are read from a prefix of it (sie_worker.adapters.layers.text_tokenizer), in-process: one "word"
of megabytes that no pre-tokenizer splits is not read whole (a byte-level BPE took seconds and gigabytes for tokens
past the cut), and what is kept equals the tokens of the whole text (unless its first 64 characters per token give
fewer tokens than the maximum length: mostly whitespace; the rest is then not read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sie_worker.adapters.layers.text_tokenizer import MAX_PREFIX_CHARS_PER_TOKEN, TextTokenizer

MAX_LENGTH = 32
CORPUS = ["the quick brown fox jumps over the lazy dog", "aaaa bbbb abab baba", "retrieval of long documents"] * 50


def trained(tmp_path_factory: pytest.TempPathFactory, pre_tokenizer: Any) -> TextTokenizer:
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizer
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["[UNK]"]
        ),
    )
    directory: Path = tmp_path_factory.mktemp("bpe")
    PreTrainedTokenizerFast(tokenizer_object=bpe, model_max_length=MAX_LENGTH).save_pretrained(directory)
    return TextTokenizer(directory, MAX_LENGTH, torch.nn.Linear(1, 1), add_special_tokens=False)  # no position table


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    """Byte-level BPE: every character gives tokens, whitespace too."""
    return trained(tmp_path_factory, pre_tokenizers.ByteLevel(add_prefix_space=False))


@pytest.fixture(scope="module")
def whitespace_dropping(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    """BPE over words split at whitespace, which gives no tokens (as BERT's WordPiece does)."""
    return trained(tmp_path_factory, pre_tokenizers.Whitespace())


def whole(tokenizer: TextTokenizer, text: str) -> list[int]:
    return tokenizer.hf(text, add_special_tokens=False)["input_ids"][:MAX_LENGTH]


@pytest.mark.parametrize(
    "text",
    [
        "ab" * 20_000,  # one word, far past the prefix bound
        "the " * 10 + "ab" * 20_000,  # ordinary words, then one that runs on
        "a" * (MAX_LENGTH * MAX_PREFIX_CHARS_PER_TOKEN - 3) + " dog",  # the word ends just inside the bound
        "the lazy dog " * 4_000,  # ordinary words: settled by the first prefixes
    ],
    ids=["one-word", "words-then-one-word", "word-ending-at-the-bound", "ordinary-words"],
)
def test_the_kept_tokens_equal_the_whole_texts(tokenizer: TextTokenizer, text: str) -> None:
    assert tokenizer.encode([text])[0].ids == whole(tokenizer, text)


class ReadLengths:
    """The tokenizer, recording the length of every text (or pair of texts, together) handed to it."""

    def __init__(self, rust: Tokenizer) -> None:
        self.rust = rust
        self.lengths: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.rust, name)

    def encode_batch(self, texts: list[str], **options: Any) -> Any:
        self.lengths += [len(text) if isinstance(text, str) else sum(map(len, text)) for text in texts]  # pairs
        return self.rust.encode_batch(texts, **options)


def test_a_word_of_megabytes_is_not_read_whole(tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    text = "ab" * 2**20  # 2 MiB, one word
    spy = ReadLengths(tokenizer.rust)
    monkeypatch.setattr(tokenizer, "rust", spy)
    encoded = tokenizer.encode([text, text])
    # equal to the tokens of a prefix twice the bound (the whole 2 MiB is what is too slow to read)
    assert [item.ids for item in encoded] == [whole(tokenizer, text[: 2 * MAX_LENGTH * MAX_PREFIX_CHARS_PER_TOKEN])] * 2
    assert spy.lengths and max(spy.lengths) == MAX_LENGTH * MAX_PREFIX_CHARS_PER_TOKEN


def test_a_pair_reads_a_mostly_whitespace_text_no_further_than_its_prefix_bound(
    whitespace_dropping: TextTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query whose read prefix gives too few tokens to settle its cut (whitespace, then words) was handed to
    every pair whole: a 2 MiB query with 16 items took 34 s and 4 GB. Each pair now reads at most the bound."""
    query = " " * (4 * MAX_LENGTH * MAX_PREFIX_CHARS_PER_TOKEN) + "the lazy dog " * 100_000
    spy = ReadLengths(whitespace_dropping.rust)
    monkeypatch.setattr(whitespace_dropping, "rust", spy)
    pairs = whitespace_dropping.encode_pairs(query, ["the quick fox"] * 16)
    assert len(pairs) == 16 and all(len(pair.ids) <= MAX_LENGTH for pair in pairs)
    assert max(spy.lengths) <= 2 * MAX_LENGTH * MAX_PREFIX_CHARS_PER_TOKEN + len("the quick fox")
