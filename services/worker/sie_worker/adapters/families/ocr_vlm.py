"""OCR vision-language models: a decoder-only language model reads a page image (its patches' features in place of
image tokens in a chat prompt) and writes the page's text. LightOnOCR (`LightOnOcrForConditionalGeneration`, a
Pixtral encoder and a Qwen3 decoder), PaddleOCR-VL (`PaddleOCRVLForConditionalGeneration`) and GLM-OCR
(`GlmOcrForConditionalGeneration`: a CogViT encoder and a GLM decoder with M-RoPE), native in
transformers, each with its processor's chat template. GLM-OCR's processor (`Glm46VProcessor`) is built without its
video processor, which needs torchvision (layers/video_free_processor.py).

Each item is a page image and, optionally, an instruction text (else run_options `prompt`, else none: LightOnOCR's
card sends the image alone). The prompt is the processor's chat template over one user turn (the image, then the
text) with the assistant's turn opened, as the model card builds it. Decoding is greedy, with the logits processors
`generate()` applies under the model's generation config (repetition penalty, forced end-of-text, ...), so the tokens
are `generate(do_sample=False, num_beams=1, max_new_tokens=n)`'s; a generation config that samples is read
greedily (an extract answer is deterministic). The answer is `{"text": processor.decode(generated,
skip_special_tokens=True)}`, the card's decode.

It runs in slices of `decode_steps` steps, as document_reader does (docs/batching.md, "How generation shares the
device"): items whose prompts have the same length and whose pages the same pixel shape start together; the KV cache
and the ids so far stay in the slice's state, and an item that ends leaves it at once.

run_options: `prompt` (default instruction, none by default), `max_new_tokens` (default for requests, 1024),
`decode_steps` (steps per slice, 32). Request options: `max_new_tokens` (1 to MAX_NEW_TOKENS).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForImageTextToText, Glm46VProcessor
from transformers.models.glm46v.image_processing_pil_glm46v import smart_resize as glm_resize
from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import smart_resize as paddle_resize

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Extraction
from sie_worker.adapters.layers.sliced_generation import (
    decode_steps,
    kept_index,
    load_generator,
    logits_processors,
    max_new_tokens_option,
    run_turn,
)
from sie_worker.adapters.layers.video_free_processor import image_processor_only
from sie_worker.adapters.spec import AdapterSpec, whole_number

# The model types this family reads.
MODEL_TYPES = ("lighton_ocr", "paddleocr_vl", "glm_ocr")
DEFAULT_MAX_NEW_TOKENS = 1024
# Upper bound of max_new_tokens, in run_options and requests: a dense page of text is about 2,000 tokens.
MAX_NEW_TOKENS = 4096
# Upper bound of the instruction's tokens (run_options.prompt or the item's text), checked before any work.
MAX_PROMPT_TOKENS = 512


@dataclass(frozen=True)
class _Page:
    """One prepared item: the processor's inputs (ids of the whole prompt, pixels and their sizes)."""

    inputs: dict[str, torch.Tensor]
    max_new_tokens: int

    def group(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        """Items with equal shapes (prompt length, pixels) prefill together without padding."""
        return tuple(sorted((name, tuple(value.shape)) for name, value in self.inputs.items()))


@dataclass
class _Generation:
    """The items of one batch that share a group, generating together."""

    rows: list[int]  # the live items' ids (positions in the first batch)
    ids: torch.Tensor  # prompt + generated ids so far
    prompt_length: int
    max_new_tokens: int
    processors: Any
    cache: Any = None
    # M-RoPE models (PaddleOCR-VL): the offset of each item's text positions past its image, which the model keeps
    # on itself between forward passes (generate() runs one generation at a time); kept here per state.
    rope_deltas: torch.Tensor | None = None
    done: dict[int, list[int]] = field(default_factory=dict)


class OcrVlm(HfAdapter):
    spec = AdapterSpec(
        "ocr_vlm",
        tasks=("extract",),
        inputs=("text", "image"),
        options=(max_new_tokens_option(MAX_NEW_TOKENS),),
    )

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        weights = str(context.weights)
        config = AutoConfig.from_pretrained(weights, local_files_only=True)
        if config.model_type not in MODEL_TYPES:
            raise ValueError(f"adapter ocr_vlm reads {', '.join(MODEL_TYPES)} models, not {config.model_type!r}")
        model_class = AutoModelForImageTextToText
        # GLM-OCR's processor declares a video processor (torchvision): built without it.
        processor = image_processor_only(Glm46VProcessor, weights) if config.model_type == "glm_ocr" else None
        self.generator, self.processor = load_generator(model_class, weights, context.dtype, context.device, processor)
        self.model = self.generator
        self.tokenizer = self.processor.tokenizer
        self.max_sequence_length = MAX_PROMPT_TOKENS
        self._special_ids = {index for index, token in self.tokenizer.added_tokens_decoder.items() if token.special}
        run = context.profile.run_options
        self.default_prompt = run.get("prompt")
        if self.default_prompt is not None:
            self._check_prompt(self.default_prompt, "run_options.prompt")
        self.max_new_tokens = whole_number(
            run.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS), "run_options.max_new_tokens", 1, MAX_NEW_TOKENS
        )
        self.decode_steps = decode_steps(run)
        eos = self.generator.generation_config.eos_token_id
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.model_type = config.model_type
        image_processor = self.processor.image_processor
        patch = image_processor.patch_size
        self._patch = int(patch["height"] if isinstance(patch, dict) else patch)
        # The frames the processor writes each resized pixel into (GLM-OCR's: 2, an image being a still video).
        self._frames = int(getattr(image_processor, "temporal_patch_size", 1)) if self.model_type == "glm_ocr" else 1
        if self.model_type == "lighton_ocr":
            self._longest_edge = int(image_processor.size["longest_edge"])
            self._merged_patch = int(self.processor.effective_patch_size)
        else:  # PaddleOCR-VL, GLM-OCR: Qwen2-VL's resize, to whole merged patches within a pixel range
            self._merged_patch = self._patch * int(image_processor.merge_size)
            self._pixel_range = (int(image_processor.size["shortest_edge"]), int(image_processor.size["longest_edge"]))
            self._smart_resize: Callable[..., tuple[int, int]] = (
                functools.partial(glm_resize, self._frames, temporal_factor=self._frames)
                if self.model_type == "glm_ocr"
                else paddle_resize
            )

    def _check_prompt(self, text: Any, where: str) -> None:
        """An instruction within the bound that holds none of the chat template's special tokens: one would end the
        user's turn early or open another (an assistant's answer written by the sender)."""
        if not isinstance(text, str):
            raise ValueError(f"{where}: must be a text, got {text!r}")
        # Bounded in characters first, so counting its tokens is bounded work.
        ids = self.tokenizer(text[: MAX_PROMPT_TOKENS * 16], add_special_tokens=False)["input_ids"]
        if len(text) > MAX_PROMPT_TOKENS * 16 or len(ids) > MAX_PROMPT_TOKENS:
            raise ValueError(f"{where}: the instruction is over {MAX_PROMPT_TOKENS} tokens; send a shorter text")
        special = sorted(self.tokenizer.convert_ids_to_tokens(sorted(self._special_ids.intersection(ids))))
        if special:
            raise ValueError(
                f"{where}: the instruction holds the prompt's special tokens {', '.join(special)}; send it without them"
            )

    def _resized(self, width: int, height: int) -> tuple[int, int] | None:
        """The (width, height) the processor makes of a page, None where it refuses the page. LightOnOCR's
        (Pixtral's) scales it down to fit `longest_edge` (never up), then rounds each side up to whole patches;
        PaddleOCR-VL's rounds each side to whole merged patches, scaled into its pixel range, and refuses a page more
        elongated than 200:1 once each side is at least one merged patch; GLM-OCR's (GLM-4.6V's) does the same, its
        pixel range counting both frames of the page."""
        if self.model_type != "lighton_ocr":
            try:
                resized_height, resized_width = self._smart_resize(
                    height,
                    width,
                    factor=self._merged_patch,
                    min_pixels=self._pixel_range[0],
                    max_pixels=self._pixel_range[1],
                )
            except ValueError:  # its aspect ratio bound
                return None
            return resized_width, resized_height
        ratio = max(height / self._longest_edge, width / self._longest_edge, 1.0)
        side = self._patch
        return math.ceil(math.floor(width / ratio) / side) * side, math.ceil(math.floor(height / ratio) / side) * side

    def resized_pixels(self, width: int, height: int) -> int:
        """The pixels of the page as the processor resizes it, each counted once per frame it is written into (the
        memory held until the page is read); 0 for a page it refuses (refused before any work: by the worker's aspect
        ratio bound, else by prepare_one)."""
        resized = self._resized(width, height)
        return 0 if resized is None else resized[0] * resized[1] * self._frames

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The chat prompt's ids and the page's pixels, at the cost of the prompt's tokens and those it may
        generate."""
        if item.image is None:
            raise ValueError("an OCR model reads a page image; the item has none")
        # A page too narrow for one image token (merged patches) gives the model nothing to read, or the processor
        # nothing to resize to (a side scaled to 0 pixels).
        merged = self._merged_patch
        resized = self._resized(*item.image.size)
        if resized is None:
            raise ValueError(
                f"the page is {item.image.size[0]}x{item.image.size[1]} pixels: too elongated for the model's "
                "processor (more than 200:1 once each side is scaled to at least one image token); crop or pad it"
            )
        if min(resized) < merged:
            raise ValueError(
                f"the page is {item.image.size[0]}x{item.image.size[1]} pixels: resized for the model, a side is "
                f"under {merged} pixels (one image token); send a larger or less elongated page"
            )
        text = item.text if item.text is not None else self.default_prompt
        content: list[dict[str, Any]] = [{"type": "image", "image": item.image.convert("RGB")}]
        if text is not None:
            self._check_prompt(text, "text")
            content.append({"type": "text", "text": text})
        inputs = self.processor.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
        )
        max_new_tokens = int(query.options.get("max_new_tokens", self.max_new_tokens))
        page = _Page({name: value for name, value in inputs.items() if name != "attention_mask"}, max_new_tokens)
        return Prepared(page, inputs["input_ids"].shape[1] + max_new_tokens)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Per item, its generated ids once it ends, else `Continued` after one slice of decode steps."""
        return run_turn(batch, _Page.group, self._prefill, self._keep, self._slice)

    def _prefill(self, pages: Sequence[_Page], rows: list[int]) -> _Generation:
        """The prompts' forward pass (the pages' features in place of their image tokens) and the first token."""
        inputs = {name: torch.cat([page.inputs[name] for page in pages]).to(self.device) for name in pages[0].inputs}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.generator.dtype)
        ids = inputs["input_ids"]
        max_new_tokens = pages[0].max_new_tokens  # one query per batch
        _, processors = logits_processors(
            self.generator, ids.shape[1], max_new_tokens, 1, has_mask=False, device=self.device
        )
        state = _Generation(list(rows), ids, ids.shape[1], max_new_tokens, processors)
        self._append(state, self._forward(state, **inputs))
        return state

    def _slice(self, state: _Generation) -> None:
        """Up to `decode_steps` greedy steps (the prefill's token counts as the first); items that end move to
        `state.done`."""
        for _ in range(self.decode_steps):
            if not state.rows:
                return
            self._append(state, self._forward(state, input_ids=state.ids[:, -1:]))

    def _forward(self, state: _Generation, **inputs: Any) -> torch.Tensor:
        """One forward pass of the state's items over `inputs` and its cache: the next token's logits."""
        inner = self.generator.model
        mrope = hasattr(inner, "rope_deltas")
        if mrope:
            inner.rope_deltas = state.rope_deltas
        out = self.generator(**inputs, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
        if mrope:
            state.rope_deltas = inner.rope_deltas
        state.cache = out.past_key_values
        return out.logits[:, -1, :]

    def _append(self, state: _Generation, logits: torch.Tensor) -> None:
        """Choose each item's next token; items that end (end-of-text, max_new_tokens) move to `state.done`."""
        chosen = state.processors(state.ids, logits.float()).argmax(dim=-1)
        state.ids = torch.cat([state.ids, chosen[:, None]], dim=-1)
        generated = state.ids.shape[1] - state.prompt_length
        ended = [
            position
            for position, token in enumerate(chosen.tolist())
            if token in self.eos or generated >= state.max_new_tokens
        ]
        for position in ended:
            state.done[state.rows[position]] = state.ids[position, state.prompt_length :].tolist()
        if ended:
            self._keep(state, [row for position, row in enumerate(state.rows) if position not in ended])

    @staticmethod
    def _keep(state: _Generation, rows: list[int]) -> None:
        """Narrow the state to `rows` (in their order in the state), dropping the others."""
        index = kept_index(state, rows, state.ids.device)
        if index is None:
            return
        state.ids = state.ids[index]
        if state.rope_deltas is not None:
            state.rope_deltas = state.rope_deltas[index]
        if state.cache is not None and rows:
            state.cache.batch_select_indices(index)

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        return Extraction(data={"text": self.processor.decode(output, skip_special_tokens=True)})
