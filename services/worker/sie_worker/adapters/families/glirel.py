"""Zero-shot relation extraction with relation labels given per request, through the optional `glirel` package.

GLiREL scores every ordered pair of entity spans against each label; it reads words, not characters. The spans come
from the request (`options.entities`: character spans into each item's text) or from a GLiNER model the profile
names (`run_options.entity_model`, a directory inside this model's or a Hub id in the local Hugging Face cache),
with entity labels from the request (`options.entity_labels`) or the profile (`run_options.entity_labels`). GLiNER
is loaded by this adapter, next to GLiREL, and runs in the same device call just before it: one model to load,
account and evict, no request from one model to another.

The checkpoint is read from its resolved directory only: `glirel_config.json` and `pytorch_model.bin`, with the
backbone its `model_name` names (a directory inside the model's, or a Hub id in the local Hugging Face cache).
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import snapshot_download

from sie_common.cluster.model_config import Profile
from sie_worker.adapters.contract import Adapter, Input, LoadContext, Prepared, Query
from sie_worker.adapters.families.gliner import GlinerExtractor
from sie_worker.adapters.items import Entity, Extraction, Relation
from sie_worker.adapters.layers.optional_packages import require_package
from sie_worker.adapters.layers.text_tokenizer import position_limit
from sie_worker.adapters.spec import AdapterSpec, Option, probability, whole_number

DEFAULT_THRESHOLD = 0.5
# Most entity spans one item takes (from the request or from GLiNER): GLiREL scores every ordered pair against every
# label (64 spans: 4,032 pairs), and turns each score over the threshold into a Python object on the device thread.
MAX_ENTITIES = 64
# Most labels kept per entity pair (`top_k`), and most entity labels for GLiNER.
MAX_TOP_K = 128
# Most relations kept per item, the best (`max_relations`): every pair over the threshold is one, up to 4,032 x the
# labels, and the request holds them all until it answers.
DEFAULT_MAX_RELATIONS = 100
MAX_RELATIONS = 1000
MAX_ENTITY_LABELS = 128
MAX_LABEL_CHARS = 256
# GLiREL's own split of a text into words (GLiREL.batch_predict_relations).
WORD = re.compile(r"\w+(?:[-_]\w+)*|\S")
# Prompt tokens GLiREL puts before the words: [REL] label ... [SEP].
REL_TOKEN, SEP_TOKEN = "[REL]", "[SEP]"


@dataclasses.dataclass(frozen=True)
class Span:
    """An entity: a character span of the item's text, and its label and score (1 for the request's own)."""

    start: int
    end: int
    label: str
    score: float = 1.0


@dataclasses.dataclass(frozen=True)
class Item:
    """One text made ready: the part GLiREL reads, its words (character offsets) and the request's spans, else the
    part GLiNER reads to find them."""

    text: str
    words: list[tuple[int, int]]
    spans: list[Span] | None
    entity_text: str | None = None


def local_directory(directory: Path, name: str, what: str) -> Path:
    """`name` as a directory inside `directory` (relative, or absolute within it), else a Hub id's snapshot in the
    local Hugging Face cache; ValueError for a directory elsewhere or a Hub id not cached."""
    inside = (directory / name).resolve()
    if inside.is_dir():
        if not inside.is_relative_to(directory.resolve()):
            raise ValueError(f"{what} {name!r} is a directory outside the model's")
        return inside
    if Path(name).is_absolute() or name.startswith((".", "~")):
        raise ValueError(f"{what} {name!r} is not a directory inside the model's")
    try:
        return Path(snapshot_download(name, local_files_only=True))
    except Exception as error:  # noqa: BLE001 - any miss of the cache (not cached, bad id) is a load failure
        raise ValueError(f"{what} {name!r}: not in the local Hugging Face cache ({error})") from None


def _labels(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ENTITY_LABELS:
        raise ValueError(f"{where}: must be a list of 1 to {MAX_ENTITY_LABELS} labels")
    for label in value:
        if not isinstance(label, str) or not 0 < len(label) <= MAX_LABEL_CHARS:
            raise ValueError(f"{where}: each label must be a string of 1 to {MAX_LABEL_CHARS} characters")
    return tuple(value)


def request_spans(value: Any) -> list[Span]:
    """`options.entities` as spans, each well formed ({start, end, label}, 0 <= start < end); the item's length is
    checked when the item is prepared."""
    if not isinstance(value, list) or len(value) > MAX_ENTITIES:
        raise ValueError(f"entities: must be a list of at most {MAX_ENTITIES} spans")
    spans = []
    for index, entity in enumerate(value):
        where = f"entities[{index}]"
        if not isinstance(entity, Mapping) or set(entity) != {"start", "end", "label"}:
            raise ValueError(f"{where}: must be an object with exactly start, end and label")
        start = whole_number(entity["start"], f"{where}.start", 0, 2**31)
        end = whole_number(entity["end"], f"{where}.end", 0, 2**31)
        if end <= start:
            raise ValueError(f"{where}: end ({end}) must be greater than start ({start})")
        label = entity["label"]
        if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS:
            raise ValueError(f"{where}.label: must be a string of at most {MAX_LABEL_CHARS} characters")
        spans.append(Span(start, end, label))
    return spans


class GlirelExtractor(Adapter):
    spec = AdapterSpec(
        "glirel",
        tasks=("extract",),
        labels=True,
        options=(
            Option(
                "top_k", "most labels kept per entity pair", lambda value: whole_number(value, "top_k", 1, MAX_TOP_K)
            ),
            Option(
                "max_relations",
                "most relations kept per item, the best",
                lambda value: whole_number(value, "max_relations", 1, MAX_RELATIONS),
            ),
            Option(
                "entities",
                "the entity spans of the items' texts: {start, end, label}",
                request_spans,
            ),
            Option(
                "entity_labels", "the labels GLiNER finds entities of", lambda value: _labels(value, "entity_labels")
            ),
        ),
    )

    def __init__(self, context: LoadContext) -> None:
        require_package("glirel", context.config.id, "pip install glirel --no-deps && pip install '.[glirel]'")
        from glirel import GLiREL
        from glirel.model import load_config_as_namespace

        config = load_config_as_namespace(context.weights / "glirel_config.json")
        if getattr(config, "add_entity_markers", False):
            raise ValueError("glirel_config.json: add_entity_markers (words inserted around entities) is not supported")
        config.fixed_relation_types = True  # one label list per call, as batch_predict_relations asks
        config.model_name = str(local_directory(context.weights, str(config.model_name), "model_name"))
        self.extractor = GLiREL(config)
        state = torch.load(context.weights / "pytorch_model.bin", map_location="cpu", weights_only=True)
        missing = self.extractor.load_state_dict(state, strict=False).missing_keys
        if missing:
            raise ValueError(f"pytorch_model.bin: {len(missing)} weights are missing, first {missing[0]!r}")
        self.extractor.to(context.device).eval()
        self.model = self.extractor
        embeddings = self.extractor.token_rep_layer.bert_layer
        self.tokenizer = embeddings.tokenizer
        self.max_words = int(config.max_len)
        limits = [position_limit(embeddings.model, table_only=True), context.config.max_sequence_length]
        self.max_tokens = min([limit for limit in limits if limit], default=None)
        self.max_sequence_length = self.max_tokens or self.max_words

        run_options = context.profile.run_options
        self.threshold = probability(run_options.get("threshold", DEFAULT_THRESHOLD), "run_options.threshold")
        self.entity_labels = (
            _labels(run_options["entity_labels"], "run_options.entity_labels")
            if "entity_labels" in run_options
            else None
        )
        self.entities: GlinerExtractor | None = None
        # GLiNER's modules, an attribute of this adapter so that its memory counts as this model's (module_bytes).
        self.entity_modules: torch.nn.Module | None = None
        entity_model = run_options.get("entity_model")
        if entity_model is not None:
            if not isinstance(entity_model, str):
                raise ValueError("run_options.entity_model: must be a directory or Hub id")
            threshold = probability(
                run_options.get("entity_threshold", DEFAULT_THRESHOLD), "run_options.entity_threshold"
            )
            profile = Profile(
                adapter="gliner", load_options=context.profile.load_options, run_options={"threshold": threshold}
            )
            weights = local_directory(context.weights, entity_model, "run_options.entity_model")
            self.entities = GlinerExtractor(dataclasses.replace(context, weights=weights, profile=profile))
            self.entity_modules = self.entities.extractor

    def check(self, query: Query) -> None:
        """Spans from the request or entity labels for GLiNER (not both)."""
        if "entities" in query.options:
            if "entity_labels" in query.options:
                raise ValueError("give either entities or entity_labels, not both")
            return
        if self.entities is None:
            raise ValueError("this model has no entity model (run_options.entity_model): give options.entities")
        if "entity_labels" not in query.options and self.entity_labels is None:
            raise ValueError("give options.entity_labels (the profile sets no run_options.entity_labels)")

    @staticmethod
    def _top_k(query: Query) -> int:
        """Most labels kept per entity pair; -1: all over the threshold."""
        value = query.options.get("top_k")
        return -1 if value is None else int(value)

    @staticmethod
    def _max_relations(query: Query) -> int:
        """Most relations kept per item, the best."""
        return int(query.options.get("max_relations", DEFAULT_MAX_RELATIONS))

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The words GLiREL reads (its first max_len, fewer where the labels and words would pass the backbone's
        positions) and the request's spans checked against the text."""
        text = item.text or ""
        words: list[tuple[int, int]] = []
        for match in WORD.finditer(text):
            if len(words) == self.max_words:
                break
            words.append(match.span())
        prompt = [piece for label in dict.fromkeys(query.labels) for piece in (REL_TOKEN, label)] + [SEP_TOKEN]
        encoding = self.tokenizer(prompt + [text[start:end] for start, end in words], is_split_into_words=True)
        tokens = len(encoding["input_ids"])
        if self.max_tokens is not None and tokens > self.max_tokens:
            first_cut = encoding.word_ids()[self.max_tokens - 1]
            if first_cut is None or first_cut < len(prompt):
                raise ValueError(f"the labels take more than the model's {self.max_tokens} tokens")
            words = words[: first_cut - len(prompt)]
            tokens = self.max_tokens
        read = text[: words[-1][1]] if words else ""
        if "entities" not in query.options:
            assert self.entities is not None  # check_query: spans come from GLiNER when the request gives none
            return Prepared(Item(read, words, None, self.entities.read_part(read)), tokens)
        spans = request_spans(query.options["entities"])
        for index, span in enumerate(spans):
            if span.end > len(text):
                raise ValueError(f"entities[{index}] ends at {span.end}, past the text's {len(text)} characters")
            if not WORD.search(text, span.start, span.end):
                raise ValueError(f"entities[{index}] ({span.start}, {span.end}) covers no word")
        return Prepared(Item(read, words, spans), tokens)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per item, its spans and GLiREL's relations between them ((head words, tail words), label, score)."""
        items: list[Item] = list(batch)
        spans = [item.spans for item in items]
        found = [row for row, item in enumerate(items) if item.spans is None and item.entity_text]
        if found:
            assert self.entities is not None  # check_query: spans come from the request when there is no GLiNER
            labels = tuple(query.options.get("entity_labels") or self.entity_labels or ())
            outputs = self.entities.run(
                [items[row].entity_text or "" for row in found], Query("extract", labels=labels)
            )
            for row, output in zip(found, outputs, strict=True):
                best = sorted(output, key=lambda span: -span[3])[:MAX_ENTITIES]
                spans[row] = [Span(start, end, label, score) for start, end, label, score in sorted(best)]
        words = [self._word_spans(item, item_spans or []) for item, item_spans in zip(items, spans, strict=True)]
        rows = [row for row, by_words in enumerate(words) if len(by_words) >= 2]
        relations: list[list[dict[str, Any]]] = [[] for _ in items]
        if rows:
            tokens = [[items[row].text[start:end] for start, end in items[row].words] for row in rows]
            ner = [[[first, last, span.label] for (first, last), span in words[row].items()] for row in rows]
            threshold = self.threshold if query.threshold is None else query.threshold
            predicted = self.extractor.batch_predict_relations(
                tokens, list(query.labels), threshold=float(threshold), ner=ner, top_k=self._top_k(query)
            )
            keep = self._max_relations(query)
            for row, item_relations in zip(rows, predicted, strict=True):
                relations[row] = sorted(item_relations, key=lambda relation: -relation["score"])[:keep]
        return [(by_words, item_relations) for by_words, item_relations in zip(words, relations, strict=True)]

    @staticmethod
    def _word_spans(item: Item, spans: list[Span]) -> dict[tuple[int, int], Span]:
        """Each span by the words it covers (first, last), the first of spans covering the same words kept; spans
        past the words read are left out."""
        starts = [start for start, _ in item.words]
        ends = [end for _, end in item.words]
        by_words: dict[tuple[int, int], Span] = {}
        for span in spans:
            first = bisect.bisect_right(ends, span.start)
            last = bisect.bisect_left(starts, span.end) - 1
            if first <= last:
                by_words.setdefault((first, last), span)
        return by_words

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        """Relations between character spans, best score first."""
        text = item.text or ""
        by_words, relations = output

        def entity(words: list[int]) -> Entity:
            span = by_words[(words[0], words[1] - 1)]
            return Entity(
                text=text[span.start : span.end], label=span.label, score=span.score, start=span.start, end=span.end
            )

        found = [
            Relation(head=entity(r["head_pos"]), tail=entity(r["tail_pos"]), label=r["label"], score=float(r["score"]))
            for r in relations
        ]
        return Extraction(relations=sorted(found, key=lambda relation: -relation.score))
