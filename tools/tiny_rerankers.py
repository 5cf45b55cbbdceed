"""Tiny random LLM rerankers built offline, for tests and benchmarks.

A byte-level BPE tokenizer trained here on a few prompt sentences (ChatML special tokens; "yes", "no", "0" and
"1" single tokens), a 2-layer decoder, and sentence-transformers' own CrossEncoder API to save the layout a
causal-LM CrossEncoder has on the Hub (Transformer + LogitScore modules, chat_template.jinja).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
)

QWEN3_SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note "
    'that the answer can only be "yes" or "no".'
)
QWEN3_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
MXBAI_TASK = (
    "You are a search relevance expert who evaluates how well documents match search queries. For each "
    "query-document pair, "
    "carefully analyze the semantic relationship between them, then provide your binary relevance judgment (0 for "
    "not relevant, 1 for relevant).\n"
    "Relevance:"
)
MXBAI_PREFIX = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\n"
)
MXBAI_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
# The mxbai-rerank-v2 prompt as a model config's load_options.template and run_options.instruction_prompt.
MXBAI_TEMPLATE = MXBAI_PREFIX + "{instruction}query: {query}\ndocument: {document}\n" + MXBAI_TASK + MXBAI_SUFFIX
MXBAI_INSTRUCTION_PROMPT = "instruction: {instruction}\n"


def _chat_template(default_instruction: str, instruction_prompt: str, *parts: str) -> str:
    """A chat template over the roles a CrossEncoder gives a pair: the system message is the instruction (through
    `instruction_prompt`, `{instruction}` where it goes), the others the query and the document. `parts` are literal
    texts and the names ns.instruction, ns.query, ns.document; the output is one expression, so the template's
    whitespace handling cannot eat a newline of the prompt."""
    before, after = (json.dumps(piece) for piece in instruction_prompt.split("{instruction}"))
    return (
        "{%- set ns = namespace(instruction=" + json.dumps(default_instruction) + ", query='', document='') -%}"
        "{%- for message in messages -%}"
        "{%- if message.role == 'system' -%}{%- set ns.instruction = "
        + before
        + " ~ message.content ~ "
        + after
        + " -%}"
        "{%- elif message.role == 'query' -%}{%- set ns.query = message.content -%}"
        "{%- elif message.role == 'document' -%}{%- set ns.document = message.content -%}{%- endif -%}"
        "{%- endfor -%}"
        "{{ " + " ~ ".join(part if part.startswith("ns.") else json.dumps(part) for part in parts) + " }}"
    )


# The Qwen3-Reranker prompt (with its default instruction) ...
QWEN3_CHAT_TEMPLATE = _chat_template(
    QWEN3_INSTRUCTION, "{instruction}",
    "<|im_start|>system\n" + QWEN3_SYSTEM + "<|im_end|>\n<|im_start|>user\n<Instruct>: ", "ns.instruction",
    "\n<Query>: ", "ns.query", "\n<Document>: ", "ns.document",
    "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
)  # fmt: skip
# ... and the mxbai-rerank-v2 one, for the sentence-transformers reference of MXBAI_TEMPLATE.
MXBAI_CHAT_TEMPLATE = _chat_template(
    "",
    MXBAI_INSTRUCTION_PROMPT,
    MXBAI_PREFIX,
    "ns.instruction",
    "query: ",
    "ns.query",
    "\ndocument: ",
    "ns.document",
    "\n" + MXBAI_TASK + MXBAI_SUFFIX,
)
_CORPUS = [
    QWEN3_SYSTEM,
    QWEN3_INSTRUCTION,
    MXBAI_TASK,
    "<Instruct>: <Query>: <Document>: system user assistant instruction: query: document:",
    "The quick brown fox jumps over the lazy dog. Search engines rank documents by relevance.",
    "What is the capital of France? Paris is the capital and most populous city of France.",
    "yes no yes no 0 1",
]
# Punctuation before a newline, for the merges Qwen2's vocabulary has ("?\n", ".\n").
_NEWLINES = ["how do plants make energy?\ndocument: Paris.\nRelevance?\n"]


# Qwen2's pre-tokenizer split: unlike GPT-2's, punctuation keeps the newlines after it ("?\n" is one piece).
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def chatml_tokenizer(max_length: int, *, qwen2_split: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE of a few hundred tokens with the ChatML special tokens of Qwen models; with `qwen2_split`,
    Qwen2's pre-tokenizer, so that `?` or `.` and a newline after them become one token, as in Qwen2's vocabulary."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = (
        pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        if qwen2_split
        else pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((_CORPUS + (_NEWLINES if qwen2_split else [])) * 20, trainer)
    tokenizer.add_tokens(["<think>", "</think>"])
    for token in ("yes", "no", "0", "1"):
        assert tokenizer.token_to_id(token) is not None, token
    if qwen2_split:
        assert tokenizer.token_to_id("?Ċ") is not None and tokenizer.token_to_id(".Ċ") is not None
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>", model_max_length=max_length
    )


Config = TypeVar("Config")


def _decoder_config(config_class: Callable[..., Config], tokenizer: PreTrainedTokenizerFast) -> Config:
    # A wide initialisation, so that scores differ visibly between pairs (the default 0.02 makes them all alike).
    return config_class(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, initializer_range=0.5,
    )  # fmt: skip


def build_tiny_qwen3_reranker(
    directory: Path, *, max_length: int = 128, classifier: bool = False, chat_template: bool = True, seed: int = 0
) -> Path:
    """A Qwen3-Reranker replica saved by sentence-transformers as a causal-LM CrossEncoder (LogitScore on yes / no);
    with `classifier`, as a one-label `Qwen3ForSequenceClassification` (the `-seq-cls` conversions' layout); without
    `chat_template`, a tokenizer with none (the CrossEncoder then reads plain text pairs)."""
    from sentence_transformers import CrossEncoder

    raw = directory / "raw"
    tokenizer = chatml_tokenizer(max_length)
    if chat_template:
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    tokenizer.save_pretrained(raw)
    torch.manual_seed(seed)
    config = _decoder_config(Qwen3Config, tokenizer)
    if classifier:
        config.num_labels = 1
    (Qwen3ForSequenceClassification if classifier else Qwen3ForCausalLM)(config).save_pretrained(raw)
    saved = directory / "st"
    CrossEncoder(str(raw), device="cpu").save(str(saved))
    return saved


def build_tiny_mxbai_reranker(
    directory: Path, *, max_length: int = 128, identity: bool = False, seed: int = 0
) -> tuple[Path, Path]:
    """An mxbai-rerank-v2 replica: a Qwen2 causal LM with no chat template and no sentence-transformers files (as
    the Hub has it: the prompt comes from the model config), and the same weights saved as a CrossEncoder whose
    chat template renders the same prompt and whose LogitScore reads "1" against "0", as the reference.
    `identity`: the CrossEncoder saves an Identity activation (raw logit differences, as mxbai's own library
    returns them) instead of the default Sigmoid. Returns (plain directory, CrossEncoder directory)."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.modules import LogitScore, Transformer

    plain = directory / "plain"
    tokenizer = chatml_tokenizer(max_length, qwen2_split=True)
    tokenizer.save_pretrained(plain)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(_decoder_config(Qwen2Config, tokenizer)).save_pretrained(plain)
    reference = directory / "reference"
    tokenizer.chat_template = MXBAI_CHAT_TEMPLATE
    tokenizer.save_pretrained(reference)
    Qwen2ForCausalLM.from_pretrained(plain).save_pretrained(reference)
    transformer = Transformer(str(reference), transformer_task="text-generation")
    vocab = tokenizer.get_vocab()
    modules = [transformer, LogitScore(true_token_id=vocab["1"], false_token_id=vocab["0"])]
    CrossEncoder(modules=modules, device="cpu", activation_fn=torch.nn.Identity() if identity else None).save(
        str(reference)
    )
    return plain, reference
