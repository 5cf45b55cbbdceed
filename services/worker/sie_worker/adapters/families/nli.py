"""Zero-shot classification by natural language inference (BART-MNLI, DeBERTa-MNLI style models).

Each label of the request becomes a hypothesis (a template with the label in place of its `{}`), and the model
reads every (text, hypothesis) pair; the entailment logit says how well the label fits. As transformers'
zero-shot-classification pipeline does: only the text is truncated (`only_first`), single-label scores are a
softmax of the entailment logits across the labels, multi-label scores (and the score of a lone label) a softmax
over (contradiction, entailment) of each label on its own.

run_options (defaults for requests that set none) and request options: `hypothesis_template` (at most
MAX_TEMPLATE_BYTES, exactly one `{}` and no other brace) and `multi_label` (true or false).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForSequenceClassification

from sie_common.edge.errors import clipped
from sie_worker.adapters.base import (
    Classification,
    ExtractInput,
    Extraction,
    ExtractQuery,
    ItemExtractor,
    LoadContext,
    Prepared,
    TokenizedText,
)
from sie_worker.adapters.hf import load_model
from sie_worker.adapters.layers.activations import softmax
from sie_worker.adapters.layers.padding import by_length, model_inputs, padded
from sie_worker.adapters.layers.text_tokenizer import TextTokenizer

DEFAULT_TEMPLATE = "This example is {}."
MAX_TEMPLATE_BYTES = 512
OPTIONS = ("hypothesis_template", "multi_label")
# Most (text, hypothesis) pairs in one forward pass: an item has one pair per label (up to SIE_MAX_LABELS).
PAIRS_PER_PASS = 64


def label_index(label2id: Mapping[str, Any], prefix: str) -> int:
    """The index of the model's first label whose name starts with `prefix` (any case); ValueError without one."""
    for name, index in label2id.items():
        if name.lower().startswith(prefix):
            return int(index)
    raise ValueError(
        f"the model's label2id {dict(label2id)} has no label starting with {prefix!r}: zero-shot classification by "
        "NLI needs the entailment label of an NLI model"
    )


def read_options(options: Mapping[str, Any], defaults: Mapping[str, Any], where: str) -> tuple[str, bool]:
    """(hypothesis template, multi_label) from `options`, else `defaults`; ValueError for a value out of bounds."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"{where}: unknown option {unknown[0]!r}; this model reads {', '.join(OPTIONS)}")
    template = options.get("hypothesis_template", defaults.get("hypothesis_template", DEFAULT_TEMPLATE))
    if not isinstance(template, str):
        raise ValueError(f"{where}.hypothesis_template: must be a string, got {type(template).__name__}")
    if len(template.encode()) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"{where}.hypothesis_template: longer than {MAX_TEMPLATE_BYTES} bytes")
    if template.count("{}") != 1 or template.count("{") != 1 or template.count("}") != 1:
        raise ValueError(
            f"{where}.hypothesis_template: must hold exactly one {{}} (where the label goes) and no other brace"
        )
    multi_label = options.get("multi_label", defaults.get("multi_label", False))
    if not isinstance(multi_label, bool):
        raise ValueError(f"{where}.multi_label: must be true or false, got {multi_label!r}")
    return template, multi_label


class NliZeroShotClassifier(ItemExtractor):
    tasks = ("extract",)
    zero_shot = True
    output_types: tuple[str, ...] = ()
    dims = 0

    def __init__(self, context: LoadContext) -> None:
        self.model = load_model(AutoModelForSequenceClassification, context, reads_padding=False)
        label2id = self.model.config.label2id or {}
        self.entailment = label_index(label2id, "entail")
        # As the pipeline picks it: the first class, or the last where entailment is first ("not_entailment" of
        # two-class models such as MoritzLaurer's zeroshot-v2.0).
        self.contradiction = len(label2id) - 1 if self.entailment == 0 else 0
        self.device = context.device
        self.tokenizer = TextTokenizer(
            context.weights,
            context.config.max_sequence_length,
            self.model,
            trust_remote_code=context.profile.trust_remote_code,
        )
        self.max_sequence_length = self.tokenizer.max_length
        # A copy of the tokenizer that cuts only the text of a pair, never the hypothesis.
        self.pairs = Tokenizer.from_str(self.tokenizer.hf.backend_tokenizer.to_str())
        self.pairs.no_padding()
        self.pairs.enable_truncation(
            self.max_sequence_length, strategy="only_first", direction=self.tokenizer.hf.truncation_side
        )
        self.pair_specials = self.pairs.num_special_tokens_to_add(is_pair=True)
        self.defaults = context.profile.run_options
        read_options({}, self.defaults, "run_options")

    def settings(self, query: ExtractQuery) -> tuple[str, bool]:
        return read_options(query.options, self.defaults, "options")

    def check_query(self, query: ExtractQuery) -> None:
        """The options in bounds, and each hypothesis short enough to leave the text a place in its pair."""
        template, _ = self.settings(query)
        for label, tokens in zip(query.labels, self._hypothesis_tokens(template, query.labels), strict=True):
            if tokens > self.max_sequence_length:
                raise ValueError(
                    f"the hypothesis of label {clipped(label)!r} with the pair's special tokens is longer than the "
                    f"model's {self.max_sequence_length} tokens: it leaves the text no place"
                )

    def _hypothesis_tokens(self, template: str, labels: tuple[str, ...]) -> list[int]:
        """The tokens of each label's hypothesis, with the pair's special tokens."""
        hypotheses = [template.format(label) for label in labels]
        encodings = self.pairs.encode_batch(hypotheses, add_special_tokens=False)
        return [len(encoding.ids) + self.pair_specials for encoding in encodings]

    def prepare(self, item: ExtractInput, query: ExtractQuery) -> Prepared:
        """The part of the text the model can read, at the cost of all its (text, hypothesis) pairs' tokens. The
        pairs themselves (labels x texts of them) are tokenized batch by batch in `run`, never a whole request's."""
        template, _ = self.settings(query)
        text = self.tokenizer.readable_prefixes([item.text or ""])[0]
        text_tokens = len(self.pairs.encode(text, add_special_tokens=False).ids)
        cost = sum(
            min(text_tokens, self.max_sequence_length - tokens) + tokens
            for tokens in self._hypothesis_tokens(template, query.labels)
        )
        return Prepared(text, cost)

    def run(self, batch: Sequence[Any], query: ExtractQuery) -> list[Any]:
        """Per item, the logits of its pairs [labels, classes]; PAIRS_PER_PASS pairs tokenized and run at a time."""
        template, _ = self.settings(query)
        hypotheses = [template.format(label) for label in query.labels]
        pairs = [(text, hypothesis) for text in batch for hypothesis in hypotheses]
        logits: list[np.ndarray] = []
        for start in range(0, len(pairs), PAIRS_PER_PASS):
            encodings = self.pairs.encode_batch(pairs[start : start + PAIRS_PER_PASS])
            tokenized = [TokenizedText(encoding.ids, type_ids=encoding.type_ids) for encoding in encodings]
            logits.extend(by_length(tokenized, self.device, self._logits))
        return [np.stack(logits[row * len(hypotheses) : (row + 1) * len(hypotheses)]) for row in range(len(batch))]

    def _logits(self, pairs: Sequence[TokenizedText]) -> np.ndarray:
        inputs = padded(pairs, self.tokenizer.pad_id, self.device)
        with torch.inference_mode():
            return self.model(**model_inputs(self.model, inputs)).logits.float().cpu().numpy()

    def finish(self, item: ExtractInput, prepared: Any, output: Any, query: ExtractQuery) -> Extraction:
        """The labels best first, without those scored below the request's threshold."""
        _, multi_label = self.settings(query)
        if multi_label or len(query.labels) == 1:
            scores = softmax(output[:, [self.contradiction, self.entailment]])[:, 1]
        else:
            scores = softmax(output[:, self.entailment])
        order = sorted(range(len(query.labels)), key=lambda index: -scores[index])
        return Extraction(
            classifications=[
                Classification(label=query.labels[index], score=float(scores[index]))
                for index in order
                if query.threshold is None or scores[index] >= query.threshold
            ]
        )
