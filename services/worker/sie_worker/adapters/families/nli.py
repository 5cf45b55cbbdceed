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
from tokenizers import Tokenizer
from transformers import AutoModelForSequenceClassification

from sie_common.edge.errors import clipped
from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Classification, Extraction, TokenizedText
from sie_worker.adapters.layers.activations import softmax
from sie_worker.adapters.layers.padding import by_length, model_inputs, padded
from sie_worker.adapters.spec import AdapterSpec, Option

DEFAULT_TEMPLATE = "This example is {}."
MAX_TEMPLATE_BYTES = 512
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


def hypothesis_template(value: Any, where: str) -> str:
    """A hypothesis template: at most MAX_TEMPLATE_BYTES, exactly one `{}` and no other brace."""
    if not isinstance(value, str):
        raise ValueError(f"{where}.hypothesis_template: must be a string, got {type(value).__name__}")
    if len(value.encode()) > MAX_TEMPLATE_BYTES:
        raise ValueError(f"{where}.hypothesis_template: longer than {MAX_TEMPLATE_BYTES} bytes")
    if value.count("{}") != 1 or value.count("{") != 1 or value.count("}") != 1:
        raise ValueError(
            f"{where}.hypothesis_template: must hold exactly one {{}} (where the label goes) and no other brace"
        )
    return value


def multi_label(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}.multi_label: must be true or false, got {value!r}")
    return value


class NliZeroShotClassifier(HfAdapter):
    spec = AdapterSpec(
        "nli_zero_shot",
        tasks=("extract",),
        labels=True,
        options=(
            Option(
                "hypothesis_template",
                "the hypothesis each label makes, `{}` where the label goes",
                lambda value: hypothesis_template(value, "options"),
            ),
            Option(
                "multi_label",
                "score each label on its own (else a softmax across the labels)",
                lambda value: multi_label(value, "options"),
            ),
        ),
    )

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        self.model = self.load(AutoModelForSequenceClassification, reads_padding=False)
        label2id = self.model.config.label2id or {}
        self.entailment = label_index(label2id, "entail")
        # As the pipeline picks it: the first class, or the last where entailment is first ("not_entailment" of
        # two-class models such as MoritzLaurer's zeroshot-v2.0).
        self.contradiction = len(label2id) - 1 if self.entailment == 0 else 0
        self.tokenizer = self.use_tokenizer(self.model)
        # A copy of the tokenizer that cuts only the text of a pair, never the hypothesis.
        self.pairs = Tokenizer.from_str(self.tokenizer.hf.backend_tokenizer.to_str())
        self.pairs.no_padding()
        self.pairs.enable_truncation(
            self.max_sequence_length, strategy="only_first", direction=self.tokenizer.hf.truncation_side
        )
        self.pair_specials = self.pairs.num_special_tokens_to_add(is_pair=True)
        defaults = context.profile.run_options
        self.template = hypothesis_template(defaults.get("hypothesis_template", DEFAULT_TEMPLATE), "run_options")
        self.multi_label = multi_label(defaults.get("multi_label", False), "run_options")

    def settings(self, query: Query) -> tuple[str, bool]:
        """The request's (hypothesis template, multi_label), else the profile's."""
        return query.options.get("hypothesis_template", self.template), query.options.get(
            "multi_label", self.multi_label
        )

    def check(self, query: Query) -> None:
        """Each hypothesis short enough to leave the text a place in its pair."""
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

    def prepare_one(self, item: Input, query: Query) -> Prepared:
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

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
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
        return self.model(**model_inputs(self.model, inputs)).logits.float().cpu().numpy()

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
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
