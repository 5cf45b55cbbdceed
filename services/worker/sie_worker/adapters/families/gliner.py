"""Zero-shot entity extraction with labels given per request, through the optional `gliner` package.

The model loads from its resolved local directory only (`local_files_only`): the tokenizer saved with it
(else the backbone's, from the local Hugging Face cache) and the backbone built from the saved
`encoder_config` (else the backbone's config in that cache). GLiNER builds backbones with
`trust_remote_code=True`; `refuse_remote_code` refuses, unless the profile sets `trust_remote_code`, a
checkpoint whose backbone would run shipped code or be read from a directory outside the model's.

run_options: `threshold` (the default when a request sets none) and `merge_adjacent_entities` (join consecutive
entities of one label at most one character apart, keeping the first one's score, as NuNER Zero's model card does).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from sie_common.edge.errors import clipped
from sie_worker.adapters.contract import Adapter, Input, LoadContext, Prepared, Query
from sie_worker.adapters.items import Entity, Extraction
from sie_worker.adapters.layers.optional_packages import (
    config_without_shipped_code,
    is_local_path,
    require_package,
)
from sie_worker.adapters.layers.text_tokenizer import position_limit
from sie_worker.adapters.spec import AdapterSpec, probability

DEFAULT_THRESHOLD = 0.5
# The backbone GLiNER's configs name when they name none.
DEFAULT_BACKBONE = "microsoft/deberta-v3-small"


def refuse_remote_code(directory: Path, trust_remote_code: bool) -> None:
    """A ValueError (a permanent load failure) when GLiNER would build a backbone from code the profile does not trust.

    GLiNER builds every backbone with code execution allowed: from a config saved in gliner_config.json, or, when
    that is left out, from the config it reads by the backbone's name. Refused: `auto_map` anywhere in the saved
    configs; a name read instead of a saved config that is a local directory (outside the model's, never read);
    a Hub id whose config in the local Hugging Face cache names shipped code."""
    if trust_remote_code:
        return
    path = directory / "gliner_config.json"
    config = config_without_shipped_code(path)
    for field, saved in _named_backbones(config):
        name = config.get(field) or DEFAULT_BACKBONE
        if not isinstance(name, str) or is_local_path(name):
            raise ValueError(
                f"{path}: {saved[0]} is not saved, and GLiNER would build that backbone from {field} "
                f"{clipped(str(name))!r}, "
                "a local path outside the model directory; save the backbone's config in gliner_config.json"
            )
        backbone = AutoConfig.from_pretrained(name, local_files_only=True)
        if getattr(backbone, "auto_map", None):
            raise ValueError(
                f"{path}: {saved[0]} is not saved, and the config of backbone {name} in the local Hugging Face cache "
                f"names "
                "shipped code (auto_map); set load_options.trust_remote_code: true to run it"
            )


def _named_backbones(config: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """(name field, saved config keys) of each backbone GLiNER builds whose config is not saved, so read by name."""
    streaming = config.get("model_type") == "gliner_streaming_span"
    backbones = [("model_name", ("decoder_config", "labels_decoder_config") if streaming else ("encoder_config",))]
    if config.get("labels_encoder"):
        backbones.append(("labels_encoder", ("labels_encoder_config",)))
    if config.get("labels_decoder"):
        backbones.append(("labels_decoder", ("labels_decoder_config", "decoder_config")))
    return [(field, saved) for field, saved in backbones if not any(isinstance(config.get(key), dict) for key in saved)]


class GlinerExtractor(Adapter):
    spec = AdapterSpec("gliner", tasks=("extract",), labels=True)

    def __init__(self, context: LoadContext) -> None:
        require_package("gliner", context.config.id, "pip install gliner --no-deps && pip install '.[gliner]'")
        from gliner import GLiNER

        refuse_remote_code(context.weights, context.profile.trust_remote_code)
        self.extractor = GLiNER.from_pretrained(
            str(context.weights),
            local_files_only=True,
            map_location=str(context.device),
            max_length=context.config.max_sequence_length,
        )
        self.extractor.to(context.device).eval()
        cap_at_position_tables(self.extractor)
        best_class_only(self.extractor.decoder)
        self.model = self.extractor.model
        self.max_sequence_length = int(self.extractor.config.max_len)
        run_options = context.profile.run_options
        self.threshold = probability(run_options.get("threshold", DEFAULT_THRESHOLD), "run_options.threshold")
        self.merge_adjacent = run_options.get("merge_adjacent_entities", False)
        self.words_splitter = self.extractor.data_processor.words_splitter
        if not isinstance(self.merge_adjacent, bool):
            raise ValueError(f"run_options.merge_adjacent_entities: must be true or false, got {self.merge_adjacent!r}")

    def read_part(self, text: str) -> str:
        """The text up to the end of the last word GLiNER reads: it keeps the first max_len words and drops the rest,
        but splits the whole text into words first (seconds and hundreds of MiB for megabytes of words)."""
        end = 0
        for count, (_, _, word_end) in enumerate(self.words_splitter(text), start=1):
            end = word_end
            if count == self.max_sequence_length:
                return text[:end]
        return text

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The part of the text GLiNER reads, at the cost of its words."""
        text = self.read_part(item.text or "")
        return Prepared(text, len(text.split()) + 1)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per text, GLiNER's spans as (start, end, label, score), in its order."""
        found = self.extractor.inference(
            list(batch),
            list(query.labels),
            threshold=self.threshold if query.threshold is None else query.threshold,
            batch_size=max(1, len(batch)),
        )
        return [[(e["start"], e["end"], e["label"], float(e["score"])) for e in entities] for entities in found]

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        text, spans = prepared, output
        if self.merge_adjacent:
            spans = merge_adjacent(text, spans)
        return Extraction(
            entities=[
                Entity(text=text[start:end], label=label, score=score, start=start, end=end)
                for start, end, label, score in spans
            ]
        )


def cap_at_position_tables(extractor: Any) -> None:
    """Truncate each backbone's input at its learned position table, not past it.

    GLiNER truncates at its tokenizers' model_max_length, which a checkpoint may leave unset or set above what its
    backbone positions; a longer input (many labels, a long text) would then fail the forward pass of its batch.
    Backbones with relative positions (DeBERTa) have no table and keep their length."""
    layer = getattr(extractor.model, "token_rep_layer", None)
    processor = extractor.data_processor
    for attribute, encoder in (("transformer_tokenizer", "bert_layer"), ("labels_tokenizer", "labels_encoder")):
        tokenizer = getattr(processor, attribute, None)
        backbone = getattr(getattr(layer, encoder, None), "model", None)
        limit = position_limit(backbone, table_only=True) if backbone is not None else None
        if tokenizer is not None and limit is not None and tokenizer.model_max_length > limit:
            tokenizer.model_max_length = limit


def best_class_only(decoder: Any) -> None:
    """Hand a span decoder only the best label of each span: the rest cannot be found.

    In flat, single-label decoding (what `extract` asks for) GLiNER keeps spans greedily by score, and two labels of one
    span overlap, so a span's lower-scored labels are never kept; yet every (span, label) over the threshold becomes a
    Python object, and the greedy pass compares each with every span kept. At a threshold of 0 that is
    words x max_width x labels candidates per text (590,000 for 384 words, width 12, 128 labels: 30 s and 200 MiB of
    one text on the device thread). Masking the lower labels (ties kept) leaves words x max_width, with the same
    answer."""
    from gliner.decoding.decoder import SpanDecoder

    if type(decoder) is not SpanDecoder:
        return
    decode = decoder.decode

    def decode_best(
        tokens: Any,
        id_to_classes: Any,
        model_output: torch.Tensor,
        *args: Any,
        flat_ner: bool = False,
        multi_label: bool = False,
        **kwargs: Any,
    ) -> Any:
        classes = model_output.shape[-1]
        if (
            flat_ner is True
            and multi_label is False
            and isinstance(id_to_classes, dict)
            and set(id_to_classes) == set(range(1, classes + 1))
        ):
            probs = torch.sigmoid(model_output)
            model_output = model_output.masked_fill(probs < probs.amax(dim=-1, keepdim=True), float("-inf"))
        return decode(tokens, id_to_classes, model_output, *args, flat_ner=flat_ner, multi_label=multi_label, **kwargs)

    decoder.decode = decode_best


Span = tuple[int, int, str, float]


def merge_adjacent(text: str, spans: list[Span]) -> list[Span]:
    """NuNER Zero's merge (its model card's `merge_entities`): in GLiNER's order, an entity of the label of the one
    before it that starts where that one ends or one character after joins it; the joined entity keeps its first
    part's score."""
    merged: list[Span] = []
    for start, end, label, score in spans:
        if merged:
            last_start, last_end, last_label, last_score = merged[-1]
            if label == last_label and start in (last_end, last_end + 1):
                merged[-1] = (last_start, end, label, last_score)
                continue
        merged.append((start, end, label, score))
    return merged
