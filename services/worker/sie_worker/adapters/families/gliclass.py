"""Zero-shot classification with labels given per request, through the optional `gliclass` package.

The model loads from its resolved local directory (`GLiClassModel.from_pretrained`); gliclass's own pipeline
for the checkpoint's architecture builds each batch's inputs (labels and text as it was trained), the model
scores every label, and the scores are gliclass's: single-label, a softmax across the labels and the best one
kept; multi-label, a sigmoid per label and those at or above the threshold kept.

run_options (defaults for requests that set none): `classification_type` (`single-label` or `multi-label`,
default multi-label as gliclass's pipeline) and `threshold` (multi-label, default 0.5). Request option:
`classification_type`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from sie_common.edge.errors import clipped
from sie_worker.adapters.contract import AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Classification, Extraction
from sie_worker.adapters.layers.activations import softmax
from sie_worker.adapters.layers.optional_packages import (
    config_without_shipped_code,
    is_local_path,
    require_package,
)
from sie_worker.adapters.spec import AdapterSpec, Option, probability

CLASSIFICATION_TYPES = ("single-label", "multi-label")
DEFAULT_THRESHOLD = 0.5
# The backbones of each architecture gliclass builds: (the name it reads, the saved config).
BACKBONES = (("encoder_model_name", "encoder_config"), ("label_model_name", "label_model_config"))


def refuse_remote_code(directory: Path, trust_remote_code: bool) -> None:
    """A ValueError (a permanent load failure) when gliclass would run code the profile does not trust.

    gliclass reads a backbone config whose model_type transformers does not know by the backbone's name, with
    code execution allowed, and applies a LoRA from `<backbone name>/adapter_config.json` where that exists on
    disk. Refused: `auto_map` anywhere in config.json; a saved backbone config of a type transformers does not
    know; a backbone name that is a local path (outside the model's directory, never checked)."""
    if trust_remote_code:
        return
    path = directory / "config.json"
    config = config_without_shipped_code(path)
    for name_field, config_field in BACKBONES:
        saved = config.get(config_field)
        if isinstance(saved, dict) and saved.get("model_type", "deberta-v2") not in CONFIG_MAPPING:
            raise ValueError(
                f"{path}: {config_field} is of model_type {clipped(str(saved.get('model_type')))!r}, which gliclass "
                "reads by name with shipped code allowed; set load_options.trust_remote_code: true to run it"
            )
        name = config.get(name_field)
        if isinstance(name, str) and is_local_path(name):
            raise ValueError(
                f"{path}: {name_field} {clipped(name)!r} is a local path outside the model directory, which gliclass "
                "reads adapters from"
            )


def read_classification_type(options: Mapping[str, Any], default: Any, where: str) -> str:
    value = options.get("classification_type", default)
    if value not in CLASSIFICATION_TYPES:
        raise ValueError(
            f"{where}.classification_type: must be one of {', '.join(CLASSIFICATION_TYPES)}, got {clipped(repr(value))}"
        )
    return str(value)


class GliclassClassifier(HfAdapter):
    spec = AdapterSpec(
        "gliclass",
        tasks=("extract",),
        labels=True,
        options=(
            Option(
                "classification_type",
                f"{' or '.join(CLASSIFICATION_TYPES)}",
                lambda value: read_classification_type({"classification_type": value}, None, "options"),
            ),
        ),
    )

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        require_package("gliclass", context.config.id, "pip install '.[gliclass]'")
        from gliclass import GLiClassModel, ZeroShotClassificationPipeline

        refuse_remote_code(context.weights, context.profile.trust_remote_code)
        self.model = GLiClassModel.from_pretrained(str(context.weights), local_files_only=True)
        self.model.to(context.device).eval()
        hf = AutoTokenizer.from_pretrained(str(context.weights), local_files_only=True)
        self.tokenizer = self.use_tokenizer(_backbone(self.model), hf=hf)
        run_options = context.profile.run_options
        self.classification_type = read_classification_type(run_options, "multi-label", "run_options")
        self.threshold = probability(run_options.get("threshold", DEFAULT_THRESHOLD), "run_options.threshold")
        self.pipeline = ZeroShotClassificationPipeline(
            self.model,
            hf,
            max_length=self.max_sequence_length,
            classification_type=self.classification_type,
            device=context.device,
            progress_bar=False,
        ).pipe
        # A uni-encoder reads the labels' prompt and the text as one input cut to the model's length.
        self.uni_encoder = getattr(self.model.config, "architecture_type", None) == "uni-encoder"
        self.text_first = self.uni_encoder and not getattr(self.model.config, "prompt_first", False)
        # A copy of the tokenizer that cuts nothing, for the length of the labels' prompt (thread-safe, as
        # TextTokenizer's).
        self.prompts = Tokenizer.from_str(hf.backend_tokenizer.to_str())
        self.prompts.no_padding()
        self.prompts.no_truncation()

    def check(self, query: Query) -> None:
        self._check_labels_read(query.labels)

    def _check_labels_read(self, labels: Sequence[str]) -> None:
        """LABELS_TOO_LONG where a uni-encoder would not read every label: its input (the labels' prompt and the
        text) is cut to the model's length, and a label cut off would be scored from a logit of 0, unread."""
        if not self.uni_encoder:
            return
        tokens = self._prompt_tokens(labels)
        if tokens > self.max_sequence_length:
            raise AdapterError(
                f"labels: the labels make a prompt of {tokens} tokens; this model reads at most "
                f"{self.max_sequence_length} with the text: send fewer or shorter labels (in several requests)",
                reason="LABELS_TOO_LONG",
                metadata={"limit": str(self.max_sequence_length), "tokens": str(tokens)},
            )

    def _prompt_tokens(self, labels: Sequence[str]) -> int:
        """The tokens of a uni-encoder's input for `labels` and an empty text (special tokens included)."""
        return len(self.prompts.encode(self.pipeline.prepare_input("", list(labels))).ids)

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The part of the text the model can read (gliclass tokenizes the whole text before truncating), at the
        cost of its tokens and its labels'. Where the text comes before the labels, it is cut to the tokens the
        labels leave, else the cut of the whole input would drop labels."""
        text = self.tokenizer.readable_prefixes([item.text or ""])[0]
        encoded = self.tokenizer.encode([text])[0]
        tokens = len(encoded.ids)
        if self.text_first:
            room = self.max_sequence_length - self._prompt_tokens(query.labels)
            ends = [
                end
                for token, (_, end) in zip(encoded.ids, encoded.offsets, strict=True)
                if token not in self.tokenizer.special_ids
            ]
            if len(ends) > room:
                text = text[: ends[room - 1]] if room > 0 else ""
        label_tokens = sum(len(encoding.ids) for encoding in self.tokenizer.rust.encode_batch(list(query.labels)))
        return Prepared(text, tokens + label_tokens)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per text, the model's logit of each label."""
        labels = list(query.labels)
        inputs = self.pipeline.prepare_inputs(list(batch), labels, same_labels=True)
        # gliclass's own rule for the label slots the model allocates (config max_labels_alloc)
        slots = self.pipeline._resolve_max_num_classes(labels, True)
        logits = self.model(**inputs, max_num_classes=slots).logits
        return list(logits[:, : len(labels)].float().cpu().numpy())

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        """Single-label: the best label, unless below the request's threshold; multi-label: the labels at or above
        the threshold, best first."""
        logits = np.asarray(output, dtype=np.float64)
        if query.options.get("classification_type", self.classification_type) == "single-label":
            scores = softmax(logits)
            order = [int(scores.argmax())]
            threshold = query.threshold
        else:
            scores = 1 / (1 + np.exp(-logits))
            order = sorted(range(len(scores)), key=lambda index: -scores[index])
            threshold = self.threshold if query.threshold is None else query.threshold
        return Extraction(
            classifications=[
                Classification(label=query.labels[index], score=float(scores[index]))
                for index in order
                if threshold is None or scores[index] >= threshold
            ]
        )


def _backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The transformer that reads the text, whose positions bound the length."""
    architecture = model.model
    for name in ("encoder_model", "encoder_decoder_model", "decoder_model"):
        backbone = getattr(architecture, name, None)
        if isinstance(backbone, torch.nn.Module):
            return backbone
    return model
