"""Schema-based extraction (GLiNER2: entities, classifications, structured fields and relations from one pass over a
text), through the optional `gliner2` package.

A request's labels are the entity types. `options.schema` adds GLiNER2's other tasks, in the package's own schema
format (what `Schema.from_dict` reads): `classifications` (a list of {task, labels, multi_label, cls_threshold, ...}),
`structures` ({name: {fields: [{name, dtype, choices, description}, ...]}}) and `relations` (a list of names, or names
to descriptions). Entities come back as entities (label: the type; score: GLiNER2's confidence; character offsets);
every other task's answer in `data`, as `GLiNER2.batch_extract(..., include_confidence=True, include_spans=True)`
gives it. The model loads from its resolved local directory (config.json, encoder_config/, model.safetensors and
its tokenizer); a saved config that names shipped code (`auto_map`) is refused unless the profile trusts it.

Each task's spans are decoded within `options.max_spans` (gliner2_spans): at a threshold near 0 GLiNER2 would find
up to words x labels entities, and take seconds of Python to decode them. A request whose schema has a task may send
no labels: GLiNER2 then answers the schema's tasks alone, as it does for a schema without entities.

run_options: `threshold` (the default when a request sets none, 0.5 as GLiNER2's).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from sie_common.edge.errors import clipped
from sie_worker.adapters.contract import Adapter, AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.families.gliner2_spans import DEFAULT_MAX_SPANS, MAX_SPANS, SpanBudget
from sie_worker.adapters.items import Entity, Extraction
from sie_worker.adapters.layers.optional_packages import auto_map_in, require_package
from sie_worker.adapters.spec import AdapterSpec, Option, probability, whole_number

DEFAULT_THRESHOLD = 0.5
# Words of a text GLiNER2 reads when neither the model config (max_sequence_length) nor the checkpoint (max_len) says.
DEFAULT_MAX_WORDS = 512
SCHEMA_KEYS = ("classifications", "structures", "relations")
# Keys of GLiNER2's answer besides the classification tasks' and structures' own names.
ANSWER_KEYS = ("entities", "relation_extraction")
# Bounds on options.schema, checked before any work (its size is the options' own bound, SIE_MAX_OPTIONS_BYTES): its
# tasks (classification tasks, structures and relation types together) and the labels of a classification task or
# fields of a structure.
MAX_SCHEMA_TASKS = 32
MAX_SCHEMA_CHOICES = 64
# Tokens of the prompt the labels and the schema make (what the encoder reads before the text), checked before any
# work: GLiNER2 never cuts it, and its encoder's time and memory grow with the square of the whole input.
MAX_PROMPT_TOKENS = 1024
# Subword tokens of the text GLiNER2 reads (after its first max_sequence_length words): it never cuts them, and the
# encoder (relative positions, no length limit) grows in time and memory with the square of its input, so the words past
# the bound are not read. A word of more characters than MAX_WORD_CHARS is over it (not tokenized to find out).
MAX_TEXT_TOKENS = 2048
MAX_WORD_CHARS = 16 * MAX_TEXT_TOKENS
# GLiNER2 keeps the subwords of up to 50,000 words in an LRU cache: only words up to this long are kept there, so a
# stream of long distinct words cannot hold gigabytes in it.
CACHED_WORD_CHARS = 32
# A classification task's labels (a list, or labels to descriptions) or a structure's fields.
Choices = list[Any] | dict[str, Any]


def read_schema(value: Any) -> dict[str, Any]:
    """options.schema within its bounds (ValueError naming what to change); GLiNER2's own validation of its fields
    comes after, in the loaded adapter's check."""
    if not isinstance(value, dict):
        raise ValueError(f"options.schema: must be an object with {', '.join(SCHEMA_KEYS)}, got {clipped(repr(value))}")
    if "entities" in value:
        raise ValueError("options.schema: entities are the request's labels; send the entity types as labels")
    unknown = sorted(set(value) - set(SCHEMA_KEYS))
    if unknown:
        raise ValueError(f"options.schema: unknown keys {clipped(str(unknown))}; it reads {', '.join(SCHEMA_KEYS)}")
    tasks = sum(len(value[key]) for key in SCHEMA_KEYS if isinstance(value.get(key), (list, dict)))
    if tasks > MAX_SCHEMA_TASKS:
        raise ValueError(
            f"options.schema: {tasks} classification tasks, structures and relations; at most {MAX_SCHEMA_TASKS} "
            "(send the rest in another request)"
        )
    for where, choices in _choices(value):
        if len(choices) > MAX_SCHEMA_CHOICES:
            raise ValueError(f"options.schema.{where}: {len(choices)} entries; at most {MAX_SCHEMA_CHOICES}")
    names = _answer_names(value)
    for name in names:
        if names.count(name) > 1 or name in ANSWER_KEYS:
            raise ValueError(
                f"options.schema: {clipped(repr(name))} names two answers: classification tasks and structures need "
                f"names of their own, not {' or '.join(ANSWER_KEYS)} (GLiNER2 answers each under its name)"
            )
    normalized: dict[str, Any] = _whole_numbers(value)
    return normalized


def _choices(schema: Mapping[str, Any]) -> list[tuple[str, Choices]]:
    """(where, entries) of each classification task's labels and each structure's fields."""
    found: list[tuple[str, Choices]] = []
    classifications = schema.get("classifications")
    if isinstance(classifications, list):
        for index, task in enumerate(classifications):
            if isinstance(task, dict) and isinstance(task.get("labels"), (list, dict)):
                found.append((f"classifications[{index}].labels", task["labels"]))
    structures = schema.get("structures")
    if isinstance(structures, dict):
        for name, structure in structures.items():
            if isinstance(structure, dict) and isinstance(structure.get("fields"), list):
                found.append((f"structures.{clipped(str(name))}.fields", structure["fields"]))
    return found


def _answer_names(schema: Mapping[str, Any]) -> list[Any]:
    """The names GLiNER2 answers the classification tasks and structures under."""
    classifications = schema.get("classifications")
    tasks = (
        [task.get("task") for task in classifications if isinstance(task, dict)]
        if isinstance(classifications, list)
        else []
    )
    structures = schema.get("structures")
    return tasks + (list(structures) if isinstance(structures, dict) else [])


def _strings(value: Any) -> Iterator[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _whole_numbers(value: Any) -> Any:
    """The value with whole-number floats as ints: a request's JSON numbers arrive as floats (a Struct), and
    GLiNER2's schema types take ints where it counts (top_k)."""
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def refuse_remote_code(directory: Path) -> None:
    """A ValueError (a permanent load failure) where a saved config names code shipped with the weights (`auto_map`):
    gliner2 builds the backbone from encoder_config/config.json with code execution allowed."""
    for saved in ("config.json", "encoder_config/config.json"):
        path = directory / saved
        config = json.loads(path.read_text(encoding="utf-8"))
        shipped = "auto_map" if isinstance(config, dict) and config.get("auto_map") else auto_map_in(config)
        if shipped is not None:
            raise ValueError(
                f"{path}: {shipped} names code shipped with the weights (auto_map); set "
                "load_options.trust_remote_code: true to run it"
            )


class Gliner2Extractor(Adapter):
    spec = AdapterSpec(
        "gliner2",
        tasks=("extract",),
        labels=True,
        options=(
            Option(
                "schema",
                "GLiNER2's classifications, structures and relations beside the labels' entity types",
                read_schema,
            ),
            Option(
                "max_spans",
                "most spans each task keeps, its best: the entity types together, a structure's list fields together",
                lambda value: whole_number(value, "max_spans", 1, MAX_SPANS),
            ),
        ),
        labels_or_option="schema",
    )

    def __init__(self, context: LoadContext) -> None:
        require_package("gliner2", context.config.id, "pip install '.[gliner2]'")
        from gliner2 import GLiNER2

        if not context.profile.trust_remote_code:
            refuse_remote_code(context.weights)
        self.extractor = GLiNER2.from_pretrained(str(context.weights), map_location=str(context.device))
        self.extractor.eval()
        architecture = getattr(self.extractor, "architecture", "span")
        if architecture != "span":
            raise ValueError(
                f"{context.weights}: a GLiNER2 checkpoint of the {architecture!r} architecture; this adapter serves "
                "the span architecture (fastino/gliner2-base-v1's), whose decoding it bounds"
            )
        self.span_budget = SpanBudget(self.extractor)
        self.model = self.extractor
        self.max_sequence_length = int(
            context.config.max_sequence_length or self.extractor.config.max_len or DEFAULT_MAX_WORDS
        )
        self.threshold = probability(
            context.profile.run_options.get("threshold", DEFAULT_THRESHOLD), "run_options.threshold"
        )
        self.split_words = self.extractor.processor.word_splitter
        self.word_tokens = _bounded_token_cache(self.extractor.processor)
        # The tokens GLiNER2 builds its prompt of ([P], [E], [SEP_TEXT], ...): in a label they shift its positions.
        self.special_tokens = tuple(self.extractor.processor.SPECIAL_TOKENS)

    def _holds_special(self, text: str) -> bool:
        folded = text.casefold()
        return any(token.casefold() in folded for token in self.special_tokens)

    def check(self, query: Query) -> None:
        """Labels, or a schema with a task; no label or schema text holding one of the prompt's special tokens;
        GLiNER2's own validation of the whole schema (its field types, dtypes, thresholds); and the length of the
        prompt it makes (GLiNER2's own record for an empty text)."""
        if not query.labels and not any(query.options.get("schema", {}).get(key) for key in SCHEMA_KEYS):
            raise AdapterError(
                "labels: send at least one label (an entity type), or an options.schema with a classification task, "
                "structure or relation",
                reason="NO_LABELS",
            )
        for index, label in enumerate(query.labels):
            if not label.strip():
                raise AdapterError(
                    f"labels[{index}]: a blank label names no entity type; send labels with a name",
                    reason="INVALID_LABEL",
                    metadata={"label": str(index)},
                )
            if self._holds_special(label):
                raise AdapterError(
                    f"labels[{index}]: {clipped(repr(label))} holds one of GLiNER2's prompt tokens "
                    f"({', '.join(self.special_tokens)}), which would break its prompt; send labels without them",
                    reason="INVALID_LABEL",
                    metadata={"label": str(index)},
                )
        if any(self._holds_special(text) for text in _strings(query.options.get("schema", {}))):
            raise AdapterError(
                f"options.schema: a name, label or description holds one of GLiNER2's prompt tokens "
                f"({', '.join(self.special_tokens)}), which would break its prompt; send it without them",
                reason="INVALID_OPTIONS",
                metadata={"option": "schema"},
            )
        tokens = self._prompt_tokens(query)
        if tokens > MAX_PROMPT_TOKENS:
            raise AdapterError(
                f"labels: the labels and options.schema make a prompt of {tokens} tokens; this model reads at most "
                f"{MAX_PROMPT_TOKENS} before the text: send fewer or shorter labels and tasks (in several requests)",
                reason="LABELS_TOO_LONG",
                metadata={"limit": str(MAX_PROMPT_TOKENS), "tokens": str(tokens)},
            )

    def _schema(self, query: Query) -> Any:
        from gliner2 import Schema

        try:
            entities = {"entities": list(query.labels)} if query.labels else {}
            return Schema.from_dict({**entities, **query.options.get("schema", {})})
        except ValueError as error:  # pydantic's ValidationError is one
            raise AdapterError(
                f"options.schema: {clipped(str(error))}", reason="INVALID_OPTIONS", metadata={"option": "schema"}
            ) from None

    def _prompt_tokens(self, query: Query) -> int:
        """Tokens of the prompt the labels and schema make: GLiNER2's own record for an empty text."""
        return len(self.extractor.processor.transform_record("", self._schema(query)).input_ids)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        """Each text as far as GLiNER2 reads it (its first max_sequence_length words, within MAX_TEXT_TOKENS subword
        tokens; the rest is never split or tokenized), at the cost of the encoder's input: the prompt's tokens and
        the text's."""
        prompt = self._prompt_tokens(query)
        return [self._read_part(item.text or "", prompt) for item in items]

    def _read_part(self, text: str, prompt: int) -> Prepared:
        words = tokens = read = 0  # words read, their tokens, the character end of the last
        for word, _, end in self.split_words(text):
            count = MAX_TEXT_TOKENS + 1 if len(word) > MAX_WORD_CHARS else len(self.word_tokens(word))
            if tokens + count > MAX_TEXT_TOKENS:
                return Prepared(text[:read], prompt + tokens)
            words, tokens, read = words + 1, tokens + count, end
            if words == self.max_sequence_length:
                return Prepared(text[:read], prompt + tokens)
        return Prepared(text, prompt + tokens)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per text, GLiNER2's formatted answer (confidences and character offsets kept), each task's spans within
        options.max_spans."""
        self.span_budget.spans = int(query.options.get("max_spans", DEFAULT_MAX_SPANS))
        return list(
            self.extractor.batch_extract(
                list(batch),
                self._schema(query),
                batch_size=max(1, len(batch)),
                threshold=self.threshold if query.threshold is None else query.threshold,
                include_confidence=True,
                include_spans=True,
                max_len=self.max_sequence_length,
            )
        )

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        answer = dict(output)
        found = answer.pop("entities", {}) or {}
        entities = [
            Entity(
                text=span["text"],
                label=label,
                score=float(span["confidence"]),
                start=int(span["start"]),
                end=int(span["end"]),
            )
            for label in query.labels
            for span in _spans(found.get(label))
        ]
        return Extraction(entities=entities, data=answer or None)


def _bounded_token_cache(processor: Any) -> Callable[[str], list[str]]:
    """GLiNER2's word tokenizer with its LRU cache kept for words up to CACHED_WORD_CHARS long (installed on the
    processor, which tokenizes each word through it): the tokenize of a word, cached or not."""
    cached = processor._tokenize_cached
    tokenize = processor.tokenizer.tokenize

    def word_tokens(word: str) -> list[str]:
        tokens: list[str] = cached(word) if len(word) <= CACHED_WORD_CHARS else tokenize(word)
        return tokens

    processor._tokenize_cached = word_tokens
    return word_tokens


def _spans(found: Any) -> list[dict[str, Any]]:
    """An entity type's spans: GLiNER2 gives a list, or one span where the type asks for one."""
    if isinstance(found, dict):
        return [found]
    return list(found or [])
