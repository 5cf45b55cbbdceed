"""Document readers: Florence-2 and Donut-style models that generate text or JSON from a page image.

Decoding is greedy, or beam search where the model's generation config asks for beams (Florence-2's: 3) or the
profile or request does, with the logits processors `generate()` would apply under the model's generation config
(forced end-of-text at the length limit, n-gram bans, ...), so the tokens are `generate(do_sample=False,
num_beams=n)`'s (beam steps: sie_worker.adapters.layers.beam_search). It runs in slices of `decode_steps` steps:
after a slice, an item still going answers `Continued`, and the pipeline queues it again behind the batches that
arrived meanwhile (docs/batching.md, "How generation shares the device"); the encoder outputs, the KV cache and the
ids or beams so far stay in the slice's state. Items that end (end-of-text, `max_new_tokens`, or, with beams, no
better hypothesis possible) leave the state at once.

run_options: `task` (the default prompt: a Florence-2 task token such as "<OCR>", or Donut's task start token such
as "<s_cord-v2>"), `max_new_tokens` (default for requests, 256), `num_beams` (default: the generation config's),
`decode_steps` (steps per slice, 32).
Request options: `task`, `max_new_tokens` (1 to MAX_NEW_TOKENS) and `num_beams` (1 to MAX_NUM_BEAMS).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoConfig,
    Florence2ForConditionalGeneration,
    VisionEncoderDecoderModel,
)
from transformers.generation.stopping_criteria import StoppingCriteriaList
from transformers.modeling_outputs import BaseModelOutput

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Extraction
from sie_worker.adapters.layers.beam_search import BeamSearch
from sie_worker.adapters.layers.sliced_generation import (
    decode_steps,
    kept_index,
    load_generator,
    logits_processors,
    max_new_tokens_option,
    run_turn,
)
from sie_worker.adapters.spec import AdapterSpec, Option, whole_number

DEFAULT_MAX_NEW_TOKENS = 256
# Upper bound of max_new_tokens, in run_options and requests.
MAX_NEW_TOKENS = 1024
# Upper bound of a prompt's tokens (the task and the item's text), checked before any work.
MAX_PROMPT_TOKENS = 512
MAX_TASK_CHARS = 128
# Upper bound of num_beams, in a model's generation config, run_options and requests: every beam holds its own KV cache.
MAX_NUM_BEAMS = 8
# What token2json reads as a field's start or end, in any case.
_DONUT_MARKUP = re.compile(r"</?s_", re.IGNORECASE)


@dataclass(frozen=True)
class _Page:
    """One prepared item: its pixels, its encoder text ids (Florence-2) and its decoder prompt ids."""

    pixels: torch.Tensor
    encoder_ids: list[int]
    prompt: list[int]
    max_new_tokens: int
    num_beams: int
    task: str
    image_size: tuple[int, int]


@dataclass
class _Generation:
    """The items of one batch that share a prompt length, generating together."""

    rows: list[int]  # the live items' ids (positions in the first batch)
    encoded: torch.Tensor  # encoder last hidden state of the live items (of each of their beams)
    mask: torch.Tensor | None  # encoder attention mask (Florence-2)
    ids: torch.Tensor  # greedy: decoder ids so far, prompt + generated
    prompt_length: int
    max_new_tokens: int
    processors: Any
    beams: BeamSearch | None = None  # beam search (num_beams > 1): the beams' ids and scores
    cache: Any = None
    done: dict[int, list[int]] = field(default_factory=dict)


class DocumentReader(HfAdapter):
    spec = AdapterSpec(
        "document_reader",
        tasks=("extract",),
        inputs=("text", "image"),
        options=(
            Option("task", "the task token the prompt starts with (a Florence-2 task, a Donut task start token)"),
            max_new_tokens_option(MAX_NEW_TOKENS),
            Option(
                "num_beams",
                f"beams of the beam search, 1 (greedy) to {MAX_NUM_BEAMS}",
                lambda value: whole_number(value, "num_beams", 1, MAX_NUM_BEAMS),
            ),
        ),
    )

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        weights = str(context.weights)
        config = AutoConfig.from_pretrained(weights, local_files_only=True)
        self.florence = config.model_type == "florence2"
        if not self.florence and config.model_type != "vision-encoder-decoder":
            raise ValueError(
                f"adapter document_reader reads Florence-2 (florence2) and Donut-style (vision-encoder-decoder) "
                f"models, not {config.model_type!r}"
            )
        model_class = Florence2ForConditionalGeneration if self.florence else VisionEncoderDecoderModel
        self.generator, self.processor = load_generator(model_class, weights, context.dtype, context.device)
        self.model = self.generator
        self.tokenizer = self.processor.tokenizer
        self.max_sequence_length = MAX_PROMPT_TOKENS
        run = context.profile.run_options
        self.task = run.get("task", "<OCR>" if self.florence else None)
        if self.task is None:
            raise ValueError("run_options.task: a Donut-style model needs its task start token, e.g. <s_cord-v2>")
        self._check_task(self.task, "run_options.task")
        self.max_new_tokens = whole_number(
            run.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), "run_options.max_new_tokens", 1, MAX_NEW_TOKENS
        )
        self.decode_steps = decode_steps(run)
        self.num_beams = self._default_beams(run)
        eos = self.generator.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        size = self.processor.image_processor.size
        self._resized = int(size["height"]) * int(size["width"])

    def _default_beams(self, run: Any) -> int:
        """run_options.num_beams, else the model's generation config's (Florence-2's asks for 3), within the bound."""
        if "num_beams" in run:
            return whole_number(run["num_beams"], "run_options.num_beams", 1, MAX_NUM_BEAMS)
        beams = self.generator.generation_config.num_beams
        if beams is None:  # unset: transformers' default, greedy
            return 1
        if not isinstance(beams, int) or isinstance(beams, bool) or not 1 <= beams <= MAX_NUM_BEAMS:
            raise ValueError(
                f"generation_config.json: num_beams {beams!r} is not 1 to {MAX_NUM_BEAMS}; set run_options.num_beams"
            )
        return beams

    def _check_task(self, task: Any, where: str) -> None:
        if not isinstance(task, str) or not task or len(task) > MAX_TASK_CHARS:
            raise ValueError(f"{where}: must be a task token of 1 to {MAX_TASK_CHARS} characters, got {task!r}")
        known = (
            self.processor.tasks_answer_post_processing_type
            if self.florence
            else [token for token in self.tokenizer.get_added_vocab() if token.startswith("<s_")]
        )
        if task not in known:
            raise ValueError(f"{where}: {task!r} is not a task of this model; it knows {', '.join(sorted(known))}")

    def resized_pixels(self, width: int, height: int) -> int:
        """The processor resizes every page to one size."""
        return self._resized

    def check(self, query: Query) -> None:
        """A task the model knows."""
        if "task" in query.options:
            self._check_task(query.options["task"], "task")

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The page's pixels and prompt, at the cost of the prompt's tokens and the tokens it may generate."""
        if item.image is None:
            raise ValueError("a document reader reads a page image; the item has none")
        task: str = query.options.get("task", self.task)
        max_new_tokens = int(query.options.get("max_new_tokens", self.max_new_tokens))
        num_beams = int(query.options.get("num_beams", self.num_beams))
        image = item.image.convert("RGB")
        if self.florence:
            inputs = self.processor(text=task + (item.text or ""), images=image, return_tensors="pt")
            encoder_ids = inputs["input_ids"][0].tolist()
            prompt = [int(self.generator.generation_config.decoder_start_token_id)]
        else:
            inputs = self.processor(images=image, return_tensors="pt")
            if item.text is not None and self._holds_markup(item.text):
                raise ValueError(
                    "a Donut question may not hold the prompt's field markup ('<s_' or '</s_'): it would end the "
                    "question early or make fields of the answer; send the question without it"
                )
            text = task if item.text is None else f"{task}<s_question>{item.text}</s_question><s_answer>"
            encoder_ids = []
            prompt = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        # the bound is on the text: Florence-2's image placeholders (577 in real checkpoints) are the page's, not it
        image_token = getattr(self.generator.config, "image_token_id", None)
        if sum(token != image_token for token in encoder_ids) + len(prompt) > MAX_PROMPT_TOKENS:
            raise ValueError(f"the prompt is over {MAX_PROMPT_TOKENS} tokens; send a shorter text")
        page = _Page(inputs["pixel_values"][0], encoder_ids, prompt, max_new_tokens, num_beams, task, image.size)
        # Each beam holds the prompt's and the generated tokens' cache.
        return Prepared(page, (len(encoder_ids) + len(prompt) + max_new_tokens) * num_beams)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per item, its generated ids once it ends, else `Continued` after one slice of decode steps."""
        return run_turn(batch, lambda page: len(page.prompt), self._start, _keep, self._slice)

    def _start(self, pages: Sequence[_Page], rows: list[int]) -> _Generation:
        """Encode the pages and set up their decoding."""
        pixels = torch.stack([page.pixels for page in pages]).to(self.device, self.generator.dtype)
        mask = None
        if self.florence:
            width = max(len(page.encoder_ids) for page in pages)
            pad = int(self.tokenizer.pad_token_id)
            ids = torch.tensor([page.encoder_ids + [pad] * (width - len(page.encoder_ids)) for page in pages])
            mask = torch.tensor([[1] * len(page.encoder_ids) + [0] * (width - len(page.encoder_ids)) for page in pages])
            ids, mask = ids.to(self.device), mask.to(self.device)
            embeds = self.generator.get_input_embeddings()(ids)
            features = self.generator.get_image_features(pixels).pooler_output.to(embeds.dtype)
            embeds = embeds.masked_scatter((ids == self.generator.config.image_token_id).unsqueeze(-1), features)
            encoded = self.generator.get_encoder()(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
        else:
            encoded = self.generator.encoder(pixel_values=pixels).last_hidden_state
        prompt = torch.tensor([page.prompt for page in pages], device=self.device)
        max_new_tokens, num_beams = pages[0].max_new_tokens, pages[0].num_beams  # one query per batch
        # generate()'s own logits processors and stopping criteria, so the tokens are its.
        config, processors = logits_processors(
            self.generator, prompt.shape[1], max_new_tokens, num_beams, has_mask=mask is not None, device=self.device
        )
        state = _Generation(list(rows), encoded, mask, prompt, prompt.shape[1], max_new_tokens, processors)
        if num_beams > 1:  # every beam of an item reads its encoder output, as generate() expands it
            state.encoded = encoded.repeat_interleave(num_beams, dim=0)
            state.mask = None if mask is None else mask.repeat_interleave(num_beams, dim=0)
            stopping = self.generator._get_stopping_criteria(
                generation_config=config, stopping_criteria=StoppingCriteriaList()
            )
            state.beams = BeamSearch(self.generator, config, prompt, stopping)
        return state

    def _slice(self, state: _Generation) -> None:
        """Up to `decode_steps` greedy or beam search steps; items that end move to `state.done`."""
        for _ in range(self.decode_steps):
            if not state.rows:
                return
            if state.beams is not None:
                self._beam_step(state, state.beams)
                continue
            step_ids = state.ids if state.cache is None else state.ids[:, -1:]
            out = self.generator(
                encoder_outputs=BaseModelOutput(last_hidden_state=state.encoded),
                attention_mask=state.mask,
                decoder_input_ids=step_ids,
                past_key_values=state.cache,
                use_cache=True,
            )
            state.cache = out.past_key_values
            scores = state.processors(state.ids, out.logits[:, -1, :].float())
            chosen = scores.argmax(dim=-1)
            state.ids = torch.cat([state.ids, chosen[:, None]], dim=-1)
            generated = state.ids.shape[1] - state.prompt_length
            ended = [
                position
                for position, token in enumerate(chosen.tolist())
                if token in self.eos or generated >= state.max_new_tokens
            ]
            if ended:
                for position in ended:
                    state.done[state.rows[position]] = state.ids[position].tolist()
                _keep(state, [row for position, row in enumerate(state.rows) if position not in ended])

    def _beam_step(self, state: _Generation, beams: BeamSearch) -> None:
        """One beam search step of every live item: generate()'s, from the log-softmax of the logits."""
        ids = beams.flat_ids()
        out = self.generator(
            encoder_outputs=BaseModelOutput(last_hidden_state=state.encoded),
            attention_mask=state.mask,
            decoder_input_ids=ids if state.cache is None else ids[:, -1:],
            past_key_values=state.cache,
            use_cache=True,
        )
        state.cache = out.past_key_values
        log_probs = torch.nn.functional.log_softmax(out.logits[:, -1, :].float(), dim=-1)
        reorder, ended = beams.step(state.processors(ids, log_probs))
        state.cache.reorder_cache(reorder)
        if any(ended):
            for position in [position for position, end in enumerate(ended) if end]:
                state.done[state.rows[position]] = beams.best(position)
            _keep(state, [row for row, end in zip(state.rows, ended, strict=True) if not end])

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        page: _Page = prepared
        if not self.florence:
            return Extraction(data=_plain(self.processor.token2json(self._donut_sequence(output))))
        text = self.tokenizer.decode(output, skip_special_tokens=False)
        parsed = self.processor.post_process_generation(text, task=page.task, image_size=page.image_size)[page.task]
        return Extraction(data={"text": parsed} if isinstance(parsed, str) else _plain(parsed))

    def _holds_markup(self, question: str) -> bool:
        """Whether a question holds field markup, as sent or as the tokenizer reads it: a tokenizer that normalises
        (NFKC, as Donut's sentencepiece one does) reads fullwidth '<', 's', '_' (U+FF1C, U+FF53, U+FF3F) as their
        ASCII forms, so the decoded prompt would hold markup that token2json parses."""
        read = self.tokenizer.decode(self.tokenizer(question, add_special_tokens=False)["input_ids"])
        return any(_DONUT_MARKUP.search(text) for text in (question, read))

    def _donut_sequence(self, ids: list[int]) -> str:
        """The Donut model cards' parse of a generation (the DocVQA pipeline's too): the whole sequence, prompt
        included, decoded with its special tokens, less end-of-text and padding, less its first tag (the task start
        token), stripped; so a question comes back in the answer's `question` field, as `token2json` reads it."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        text = text.replace(str(self.tokenizer.eos_token), "").replace(str(self.tokenizer.pad_token), "")
        return re.sub(r"<.*?>", "", text, count=1).strip()


def _keep(state: _Generation, rows: list[int]) -> None:
    """Narrow the state to `rows` (in their order in the state), dropping the others."""
    index = kept_index(state, rows, state.ids.device)
    if index is None:
        return
    state.ids = state.ids[index]
    if state.beams is not None:  # the per-row tensors and the cache hold each item's beams
        index = state.beams.keep(index)
    state.encoded = state.encoded[index]
    if state.mask is not None:
        state.mask = state.mask[index]
    if state.cache is not None and rows:
        state.cache.batch_select_indices(index)


def _plain(value: Any) -> Any:
    """A parsed result as JSON-ready values (a protobuf Struct): lists for tuples and arrays, floats for numbers."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray, torch.Tensor)):
        return [_plain(item) for item in (value.tolist() if hasattr(value, "tolist") else value)]
    if isinstance(value, (np.generic,)):
        return value.item()
    return value
