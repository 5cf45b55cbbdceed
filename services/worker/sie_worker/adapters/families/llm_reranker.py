"""LLM rerankers: a decoder reads a prompt made of the (query, document) pair and scores from its last token.

Qwen3-Reranker style (`*ForCausalLM`): the score is logit[true token] - logit[false token] at the last real
token (the true-token logit alone when there is no false token), as sentence-transformers' `LogitScore` module
computes it, then the CrossEncoder activation (Sigmoid unless the directory saved another): sigmoid of the
difference is the yes-probability of a softmax over the two tokens. mxbai-rerank-v2 style checkpoints converted
to `*ForSequenceClassification` score with their own one-label head at the last real token.

The prompt: load_options `template` (sie_worker.adapters.layers.pair_templates.TextTemplate), else the tokenizer's chat
template with the roles sentence-transformers gives a pair, else the plain pair. A text over the maximum length
is cut at its end and its template tail (the tokens after the document, e.g. the assistant turn) written back
over its last tokens, as sentence-transformers restores a chat template's suffix, so the last token stays the one
the model was trained to answer at. Left and right padding give the same scores: positions count real tokens
only, and the score is read at each row's last real token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedModel

from sie_worker.adapters.contract import AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import TokenizedText
from sie_worker.adapters.layers.activations import ACTIVATIONS, saved_activation
from sie_worker.adapters.layers.checkpoint_files import module_folder, read_json, read_modules
from sie_worker.adapters.layers.padding import by_length
from sie_worker.adapters.layers.pair_templates import ChatTemplate, PairTemplate, TextTemplate
from sie_worker.adapters.spec import AdapterSpec

# The pair fillers whose renders differ only in content: their common token tail is the template's.
_FILLERS = ("0", "1 2 3 4")


class LlmReranker(HfAdapter):
    spec = AdapterSpec("llm_reranker", tasks=("score",), pairs=True)

    model: PreTrainedModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        directory = context.weights
        options = context.profile.load_options
        run_options = context.profile.run_options
        architecture = str((read_json(directory / "config.json").get("architectures") or [""])[0])
        self.own_head = architecture.endswith("ForSequenceClassification")
        self.model = self.load(AutoModelForSequenceClassification if self.own_head else AutoModelForCausalLM)
        self.backbone = getattr(self.model, self.model.base_model_prefix)
        self.tokenizer = self.use_tokenizer(self.model)
        # A copy that never truncates: the template tail is restored after the cut (_truncate).
        self.untruncated = Tokenizer.from_str(self.tokenizer.hf.backend_tokenizer.to_str())
        self.untruncated.no_truncation()
        self.untruncated.no_padding()
        self.padding_side = options.get("padding_side", self.tokenizer.hf.padding_side)
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side {self.padding_side!r} is not one of left, right")
        self.template = _template(directory, options, run_options, self.tokenizer.hf)
        self.default_instruction: str | None = run_options.get("default_instruction", _saved_default_prompt(directory))
        if self.own_head:
            if self.model.config.num_labels != 1:
                raise ValueError(f"a reranker needs one output label; this model has {self.model.config.num_labels}")
            if not isinstance(getattr(self.model, "score", None), torch.nn.Module):
                # An encoder's classifier (BERT's `classifier`) failed every request: use adapter cross_encoder.
                raise ValueError(
                    f"{architecture} has no decoder `score` head; an encoder cross-encoder is adapter cross_encoder"
                )
            self.token_ids: list[int] = []
        else:
            self.token_ids = _score_tokens(
                directory, options, self.tokenizer.hf, self.model.get_output_embeddings().weight.shape[0]
            )
        activation = options.get("activation") or saved_activation(directory)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.activation = ACTIVATIONS[activation]

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        pair = items[0].pair or "" if items else ""
        tokenized = self.tokenize_pairs(pair, [item.text or "" for item in items], query.instruction)
        return [Prepared(item, len(item.ids)) for item in tokenized]

    def tokenize_pairs(self, query: str, texts: Sequence[str], instruction: str | None) -> list[TokenizedText]:
        """Each (query, text) pair in the prompt, with the request's instruction (else the model's default)."""
        instruction = instruction if instruction is not None else self.default_instruction
        if self.template is None:  # plain pairs: the instruction goes before the query, as a CrossEncoder prompt does
            return self.tokenizer.encode_pairs((instruction or "") + query, texts)
        query, *documents = self._readable([query, *texts])
        tail = self._template_tail(self.template, instruction)
        # A prompt that fills the model's length before the document (a long query or instruction, a template
        # longer than the model reads) would give every document the same score: no token of it is read.
        around = len(self._encode([self.template.render(query, "", instruction)])[0])
        if around >= self.max_sequence_length:
            raise AdapterError(
                f"the prompt around the document (template, instruction and query) is {around} tokens, and the model "
                f"reads"
                f" {self.max_sequence_length}: no token of any document would be read",
                reason="PROMPT_TOO_LONG",
                metadata={"limit": str(self.max_sequence_length)},
            )
        rendered = [self.template.render(query, document, instruction) for document in documents]
        return [TokenizedText(self._truncate(ids, tail)) for ids in self._encode(rendered)]

    def run(self, batch: Sequence[TokenizedText], query: Query) -> np.ndarray:
        return np.array(by_length(batch, self.device, self._score), dtype=np.float32)

    def _readable(self, texts: list[str]) -> list[str]:
        """Long texts cut where the tokens a sequence can keep of them surely end (TextTokenizer.readable_prefixes),
        so a huge document costs what the model reads of it."""
        long = [index for index, text in enumerate(texts) if len(text) > self.max_sequence_length]
        for index, text in zip(long, self.tokenizer.readable_prefixes([texts[index] for index in long]), strict=True):
            texts[index] = text
        return texts

    def _template_tail(self, template: PairTemplate, instruction: str | None) -> list[int]:
        """The template's tokens after the document: the common token tail of two renders that differ only in
        content."""
        first, second = self._encode([template.render(filler, filler, instruction) for filler in _FILLERS])
        common = 0
        for left, right in zip(reversed(first), reversed(second), strict=False):
            if left != right:
                break
            common += 1
        return first[len(first) - common :] if 0 < common < min(len(first), len(second)) else []

    def _encode(self, prompts: list[list[str]]) -> list[list[int]]:
        """Each prompt's tokens: its pieces tokenized one by one (no special tokens added), joined in order."""
        encodings = iter(
            self.untruncated.encode_batch([piece for pieces in prompts for piece in pieces], add_special_tokens=False)
        )
        return [[token for _ in pieces for token in next(encodings).ids] for pieces in prompts]

    def _truncate(self, ids: list[int], tail: list[int]) -> list[int]:
        limit = self.max_sequence_length
        if len(ids) <= limit:
            return ids
        kept = ids[:limit] if self.tokenizer.hf.truncation_side == "right" else ids[-limit:]
        if tail and len(tail) < limit:
            kept[-len(tail) :] = tail
        return kept

    def _score(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        lengths = [len(item.ids) for item in batch]
        longest = max(lengths)
        ids = np.full((len(batch), longest), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, item in enumerate(batch):
            start = longest - len(item.ids) if self.padding_side == "left" else 0
            ids[row, start : start + len(item.ids)] = item.ids
            mask[row, start : start + len(item.ids)] = 1
        positions = np.maximum(mask.cumsum(axis=1) - 1, 0)
        last = [longest - 1] * len(batch) if self.padding_side == "left" else [length - 1 for length in lengths]
        hidden = self.backbone(
            input_ids=torch.from_numpy(ids).to(self.device),
            attention_mask=torch.from_numpy(mask).to(self.device),
            position_ids=torch.from_numpy(positions).to(self.device),
        ).last_hidden_state
        final = hidden[torch.arange(len(batch), device=self.device), torch.tensor(last, device=self.device)]
        logits = self._head(final).float()
        scores = logits[:, 0] - logits[:, 1] if logits.shape[1] == 2 else logits[:, 0]
        return self.activation(scores).cpu().numpy()

    def _head(self, final: torch.Tensor) -> torch.Tensor:
        """The model's own head on the last real tokens: the classifier, or the output-embedding rows of the score
        tokens."""
        if self.own_head:
            # torch types a module's attributes as Tensor | Module
            return self.model.score(final)  # type: ignore[operator]
        head = self.model.get_output_embeddings()
        bias = head.bias[self.token_ids] if getattr(head, "bias", None) is not None else None
        logits = torch.nn.functional.linear(final, head.weight[self.token_ids], bias)
        softcap = getattr(self.model.config, "final_logit_softcapping", None)
        return torch.tanh(logits / softcap) * softcap if softcap else logits


def _template(
    directory: Path, options: Mapping[str, Any], run_options: Mapping[str, Any], tokenizer: Any
) -> PairTemplate | None:
    if "template" in options:
        return TextTemplate(options["template"], str(run_options.get("instruction_prompt", "{instruction}")))
    if getattr(tokenizer, "chat_template", None):
        modality = read_json(directory / "sentence_bert_config.json").get("modality_config") or {}
        message = modality.get("message") if isinstance(modality, dict) else None
        if not isinstance(
            message or {}, dict
        ):  # a list here retried the load for ever (AttributeError reads as transient)
            raise ValueError("sentence_bert_config.json: modality_config.message is not a mapping")
        return ChatTemplate(tokenizer, flat=(message or {}).get("format", "flat") == "flat")
    return None


def _score_tokens(directory: Path, options: Mapping[str, Any], tokenizer: Any, vocabulary: int) -> list[int]:
    """The true (and false) token ids: load_options true_token / false_token (null: none), else the directory's
    LogitScore module, else "yes" / "no" as sentence-transformers picks for a causal LM. Each a row of the
    model's output embeddings (`vocabulary` rows): a saved id past them failed every request, a negative one
    silently read another token's row."""
    saved = next(
        (entry for entry in read_modules(directory) if str(entry.get("type", "")).endswith(".LogitScore")), None
    )
    if saved is not None and "true_token" not in options and "false_token" not in options:
        config = read_json(module_folder(directory, str(saved.get("path", ""))) / "config.json")
        ids = [config["true_token_id"], config.get("false_token_id")]
    else:
        ids = [
            _token_id(tokenizer, options.get("true_token", "yes")),
            _token_id(tokenizer, options.get("false_token", "no")),
        ]
    for token in ids:
        if token is not None and (type(token) is not int or not 0 <= token < vocabulary):
            raise ValueError(f"score token id {token!r} is not a token of this model (0 to {vocabulary - 1})")
    return [token for token in ids if token is not None]


def _token_id(tokenizer: Any, token: str | None) -> int | None:
    if token is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(str(token))
    if token_id is None or token_id == tokenizer.unk_token_id:
        raise ValueError(f"score token {token!r} is not one token of this model's vocabulary")
    return int(token_id)


def _saved_default_prompt(directory: Path) -> str | None:
    """The CrossEncoder's default prompt (config_sentence_transformers.json default_prompt_name), if any."""
    config = read_json(directory / "config_sentence_transformers.json")
    name = config.get("default_prompt_name")
    if not name:
        return None
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):  # a list of prompts retried the load for ever (AttributeError reads as transient)
        raise ValueError("config_sentence_transformers.json: prompts is not a mapping of names to texts")
    prompt = prompts.get(name)
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError(f"config_sentence_transformers.json: default prompt {name!r} is not a text")
    return prompt
