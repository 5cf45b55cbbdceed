"""Qwen-VL chat inputs, as the Qwen3-VL embedding and reranking models' reference code makes them: images resized
the qwen-vl-utils way (RGB, an RGBA image laid on white; each side a multiple of the merged patch, within a pixel
range, the aspect ratio kept), a conversation rendered with the model's chat template, then transformers'
Qwen3VLProcessor with resizing off (the image tokens expanded, the pixels normalized into patches).

The processor is transformers' own, built from the checkpoint's tokenizer and image processor (PIL backend) without
its video processor, which needs torchvision: this worker reads images, never videos. Each preprocessing thread has
its own copy (the tokenizer sets padding and truncation on its Rust tokenizer at every call)."""

from __future__ import annotations

import copy
import math
import threading
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import AutoConfig, Qwen3VLProcessor

from sie_worker.adapters.contract import AdapterError
from sie_worker.adapters.layers.text_tokenizer import TextTokenizer
from sie_worker.adapters.layers.video_free_processor import image_processor_only
from sie_worker.adapters.spec import whole_number

# qwen-vl-utils' bounds: an aspect ratio of at most 200, and 4 to 16,384 image tokens.
MAX_ASPECT_RATIO = 200
MIN_IMAGE_TOKENS = 4
MAX_IMAGE_TOKENS = 16384
# The reference code's default pixel range: 4 to 1,800 image tokens (merged patches).
DEFAULT_MAX_IMAGE_TOKENS = 1800
# Upper bound of an instruction's tokens, checked before any work.
MAX_INSTRUCTION_TOKENS = 1024


@dataclass(frozen=True)
class ChatInputs:
    """One prompt as the processor made it: its token ids, their modality (0 text, 1 image: what M-RoPE reads) and,
    with an image, its patches and their grid. The processor writes each patch over `frames` identical frames (an
    image is a video of one still); only the first is held, as (patches, channels, pixels of a patch): 12 bytes a
    resized pixel, not 24, until the batch runs (`batched` repeats it on the device)."""

    ids: list[int]
    types: list[int]
    pixel_values: np.ndarray | None = None
    grid: np.ndarray | None = None
    frames: int = 1

    def cut(self, kept: Sequence[int]) -> ChatInputs:
        """The prompt with only the tokens at positions `kept` (in order)."""
        return ChatInputs(
            [self.ids[i] for i in kept], [self.types[i] for i in kept], self.pixel_values, self.grid, self.frames
        )


class QwenVlChat:
    """A Qwen-VL checkpoint's processor, and the image bounds of load_options `min_pixels` / `max_pixels`; texts
    read as far as a prompt of `max_length` tokens can hold of them (`text_model`: the decoder, its positions)."""

    def __init__(self, directory: Path, load_options: dict[str, Any], max_length: int, text_model: Any) -> None:
        self.processor = image_processor_only(Qwen3VLProcessor, directory)
        tokenizer = self.processor.tokenizer
        image_processor = self.processor.image_processor
        self.text = TextTokenizer(directory, max_length, text_model, hf=tokenizer, add_special_tokens=False)
        self.tokenizer = tokenizer
        self.pad_id = int(tokenizer.pad_token_id)
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self.factor = int(image_processor.patch_size) * int(image_processor.merge_size)
        self.frames = int(image_processor.temporal_patch_size)
        area = self.factor * self.factor
        low, high = MIN_IMAGE_TOKENS * area, MAX_IMAGE_TOKENS * area
        self.min_pixels = whole_number(
            load_options.get("min_pixels", MIN_IMAGE_TOKENS * area), "load_options.min_pixels", low, high
        )
        self.max_pixels = whole_number(
            load_options.get("max_pixels", DEFAULT_MAX_IMAGE_TOKENS * area), "load_options.max_pixels", low, high
        )
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"load_options.min_pixels {self.min_pixels} is over max_pixels {self.max_pixels}")
        self._chat_ids = {
            index for index, token in tokenizer.added_tokens_decoder.items() if token.special
        } | self.special_ids
        self._local = threading.local()

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """qwen-vl-utils' smart_resize: (width, height), each side a multiple of the merged patch, within the pixel
        range. ValueError for an aspect ratio over 200."""
        factor = self.factor
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise ValueError(
                f"the image is {width}x{height} pixels: its aspect ratio is over {MAX_ASPECT_RATIO}; send a less "
                "elongated image"
            )
        new_height = max(factor, round(height / factor) * factor)
        new_width = max(factor, round(width / factor) * factor)
        if new_height * new_width > self.max_pixels:
            beta = math.sqrt(height * width / self.max_pixels)
            new_height = math.floor(height / beta / factor) * factor
            new_width = math.floor(width / beta / factor) * factor
        elif new_height * new_width < self.min_pixels:
            beta = math.sqrt(self.min_pixels / (height * width))
            new_height = math.ceil(height * beta / factor) * factor
            new_width = math.ceil(width * beta / factor) * factor
        if min(new_width, new_height) < factor:
            raise ValueError(f"the image is {width}x{height} pixels: resized, a side is under {factor} pixels")
        return new_width, new_height

    def resized_pixels(self, width: int, height: int) -> int:
        """The pixels `resized` makes of an image (its own, where it refuses the image: the image bounds then say)."""
        try:
            resized_width, resized_height = self.resized(width, height)
        except ValueError:
            return width * height
        return resized_width * resized_height

    def model_image(self, image: Image.Image) -> Image.Image:
        """The image as the model reads it: RGB (RGBA laid on white), resized (bicubic) to `resized`."""
        if image.mode == "RGBA":
            rgb = Image.new("RGB", image.size, (255, 255, 255))
            rgb.paste(image, mask=image.split()[3])
        else:
            rgb = image.convert("RGB")
        return rgb.resize(self.resized(*rgb.size), Image.Resampling.BICUBIC)

    def check_text(self, text: str, where: str, limit: int | None = None) -> None:
        """ValueError for a text over `limit` tokens (when given) or holding the chat's special tokens (one would end
        a turn early or stand for an image that is not there). With a limit, bounded in characters first, so
        counting is bounded work."""
        if limit is not None and len(text) > limit * 16:
            raise ValueError(f"{where}: over {limit} tokens; send a shorter text")
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if limit is not None and len(ids) > limit:
            raise ValueError(f"{where}: over {limit} tokens; send a shorter text")
        special = sorted(self.tokenizer.convert_ids_to_tokens(sorted(self._chat_ids.intersection(ids))))
        if special:
            raise ValueError(f"{where}: holds the prompt's special tokens {', '.join(special)}; send it without them")

    def user_content(self, text: str | None, image: Image.Image | None) -> tuple[list[dict[str, Any]], Any]:
        """An item's part of the user turn, as the reference writes it: its image (resized), then its text ("NULL"
        for neither); and the resized image. ValueError for a text holding the chat's special tokens."""
        content: list[dict[str, Any]] = []
        resized = None
        if image is not None:
            resized = self.model_image(image)
            content.append({"type": "image", "image": resized})
        if text is not None:
            text = self.readable(text)
            self.check_text(text, "text")
            content.append({"type": "text", "text": text})
        return content or [{"type": "text", "text": "NULL"}], resized

    def readable(self, text: str) -> str:
        """The text cut where the tokens a prompt can hold of it surely end (a 2 MiB text took 12 s to tokenize
        whole, twice): what the model reads of it is the same."""
        return self.text.readable_prefixes([text])[0]

    def check_instruction(self, text: str) -> None:
        """A request's instruction: at most MAX_INSTRUCTION_TOKENS, no special tokens (INVALID_INSTRUCTION)."""
        try:
            self.check_text(text, "instruction", MAX_INSTRUCTION_TOKENS)
        except ValueError as error:
            raise AdapterError(str(error), reason="INVALID_INSTRUCTION") from None

    def encode(self, messages: list[dict[str, Any]], image: Image.Image | None) -> ChatInputs:
        """The conversation's prompt (the assistant's turn opened), with the item's image (resized already)."""
        processor = self._processor()
        text = processor.apply_chat_template([messages], add_generation_prompt=True, tokenize=False)
        inputs = processor(
            text=text, images=None if image is None else [image], do_resize=False, padding=False, return_tensors="np"
        )
        ids = inputs["input_ids"][0].tolist()
        types = inputs["mm_token_type_ids"][0].tolist()
        if image is None:
            return ChatInputs(ids, types)
        patches = inputs["pixel_values"]
        channels = len(self.processor.image_processor.image_mean)
        first = patches.reshape(len(patches), channels, self.frames, -1)[:, :, 0]
        return ChatInputs(ids, types, np.ascontiguousarray(first), inputs["image_grid_thw"], self.frames)

    def _processor(self) -> Any:
        processor = getattr(self._local, "processor", None)
        if processor is None:
            processor = self._local.processor = copy.deepcopy(self.processor)
        return processor


def with_period(instruction: str) -> str:
    """The embedder reference's instruction: stripped, and a period added unless it ends in punctuation."""
    instruction = instruction.strip()
    if instruction and not unicodedata.category(instruction[-1]).startswith("P"):
        instruction += "."
    return instruction


def batched(batch: Sequence[ChatInputs], pad_id: int, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The model's inputs for a batch: ids right-padded with their mask and modality, the images' patches (each
    patch's frame repeated as the processor writes it, on the device) and grids in item order."""
    longest = max(len(item.ids) for item in batch)
    ids = np.full((len(batch), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), longest), dtype=np.int64)
    types = np.zeros((len(batch), longest), dtype=np.int64)
    for row, item in enumerate(batch):
        ids[row, : len(item.ids)] = item.ids
        mask[row, : len(item.ids)] = 1
        types[row, : len(item.ids)] = item.types
    inputs: dict[str, Any] = {
        "input_ids": torch.from_numpy(ids).to(device),
        "attention_mask": torch.from_numpy(mask).to(device),
        "mm_token_type_ids": torch.from_numpy(types).to(device),
    }
    images = [item for item in batch if item.pixel_values is not None]
    if images:
        first = torch.from_numpy(np.concatenate([item.pixel_values for item in images])).to(device, dtype)
        patches, channels, pixels = first.shape
        frames = first.unsqueeze(2).expand(patches, channels, images[0].frames, pixels)
        inputs["pixel_values"] = frames.reshape(patches, -1)
        inputs["image_grid_thw"] = torch.from_numpy(np.concatenate([item.grid for item in images])).to(device)
    return inputs


def last_tokens(hidden: torch.Tensor, batch: Sequence[ChatInputs]) -> torch.Tensor:
    """Each row's hidden state at its last real token (right padding)."""
    rows = torch.arange(len(batch), device=hidden.device)
    return hidden[rows, torch.tensor([len(item.ids) - 1 for item in batch], device=hidden.device)]


def check_model_type(directory: Any) -> Any:
    """The checkpoint's config; ValueError unless it is a Qwen3-VL model."""
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    if config.model_type != "qwen3_vl":
        raise ValueError(f"this adapter reads qwen3_vl models, not {config.model_type!r}")
    return config


def max_tokens(configured: int | None, default: int, config: Any) -> int:
    """The prompt's token limit: the model config's max_sequence_length, else `default`, within the positions."""
    positions = int(config.text_config.max_position_embeddings)
    limit = configured or min(default, positions)
    if limit > positions:
        raise ValueError(f"max_sequence_length {limit} is over the model's {positions} positions")
    return limit
