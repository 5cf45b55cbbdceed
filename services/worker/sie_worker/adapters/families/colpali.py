"""Visual document retrievers (ColPali on PaliGemma, ColQwen2 on Qwen2-VL) through `transformers`: one
L2-normalized vector per token of a text query or of a page image, compared by MaxSim.

The directory is a ColPaliForRetrieval or ColQwen2ForRetrieval checkpoint (the family is read from its config's
model_type) with its processor. Texts go through the processor's query path (its query prefix, the text, ten
query augmentation tokens and a newline); images through its image path (the image tokens and the visual prompt).
Every position the model attends to yields a vector; padding yields none (the model zeroes those rows). ColQwen2
resizes each image to a multiple of 28 pixels within its processor's min_pixels / max_pixels, so an image yields
as many vectors as it has patches; ColPali resizes every image to one size. An image costs its tokens in a batch.
The model config's `max_sequence_length` (default 512) cuts a query's tokens.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import transformers
from PIL import Image
from transformers import AutoConfig, AutoProcessor, PreTrainedModel

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, TokenizedText
from sie_worker.adapters.layers.padding import padded
from sie_worker.adapters.spec import AdapterSpec

# model_type -> the transformers class (looked up on load: importing one loads its modeling code).
_MODELS = {"colpali": "ColPaliForRetrieval", "colqwen2": "ColQwen2ForRetrieval"}
DEFAULT_QUERY_TOKENS = 512


@dataclass(frozen=True)
class PageImage:
    """One image as its processor made it: the prompt's token ids (image tokens included) and its pixel values
    (ColQwen2: its patches and their grid)."""

    ids: list[int]
    pixel_values: np.ndarray
    grid: np.ndarray | None = None


class PageRetriever(HfAdapter):
    spec = AdapterSpec("colpali", tasks=("encode", "score"), inputs=("text", "image"), outputs=("multivector",))

    model: PreTrainedModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        model_type = AutoConfig.from_pretrained(context.weights).model_type
        if model_type not in _MODELS:
            raise ValueError(
                f"model_type {model_type!r} is not a visual document retriever: one of {', '.join(_MODELS)}"
            )
        self.model = self.load(getattr(transformers, _MODELS[model_type]))
        self.processor = AutoProcessor.from_pretrained(context.weights, backend="pil")
        self.qwen = model_type == "colqwen2"
        self.normalized = True
        self.multivector_dims = int(self.model.config.embedding_dim)
        self.max_sequence_length = context.config.max_sequence_length or DEFAULT_QUERY_TOKENS
        self.pad_id = int(self.processor.tokenizer.pad_token_id)
        self._local = threading.local()

    def _processor(self) -> Any:
        """This thread's copy of the processor: its tokenizer sets padding and truncation on its Rust tokenizer at
        every call, which two preprocessing threads must not do at once."""
        processor = getattr(self._local, "processor", None)
        if processor is None:
            processor = self._local.processor = copy.deepcopy(self.processor)
        return processor

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        """Every text as a query (the processor's query path, after the request's instruction), cut to
        max_sequence_length tokens; an image through the processor's image path. Each yields a vector per token:
        an image's are also its cost in a batch."""
        if query.modality == "image":
            images = [self.prepare_image(item.decoded_image()) for item in items]
            return [Prepared(image, len(image.ids), len(image.ids)) for image in images]
        prompt = self.prompt(query)
        prepared = []
        for item in items:
            ids = self._processor().process_queries([prompt + (item.text or "")])["input_ids"][0].tolist()
            tokens = TokenizedText(ids[: self.max_sequence_length], is_query=True)
            prepared.append(Prepared(tokens, len(tokens.ids), len(tokens.ids)))
        return prepared

    def run(self, batch: Sequence[Any], query: Query) -> list[EncodedItem]:
        return self.encode_images(batch) if query.modality == "image" else self.encode(batch)

    def resized_pixels(self, width: int, height: int) -> int:
        """ColQwen2: the multiple of its patch grid within min_pixels / max_pixels that keeps the aspect ratio;
        ColPali: its one size."""
        processor = self.processor.image_processor
        if self.qwen:
            from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

            try:
                resized_height, resized_width = smart_resize(
                    height,
                    width,
                    factor=processor.patch_size * processor.merge_size,
                    min_pixels=processor.size["shortest_edge"],
                    max_pixels=processor.size["longest_edge"],
                )
            except ValueError:  # an aspect ratio over 200, which SIE_MAX_IMAGE_ASPECT_RATIO refuses next
                return width * height
            return resized_height * resized_width
        return processor.size["height"] * processor.size["width"]

    def prepare_image(self, image: Image.Image) -> PageImage:
        # (ColPali's processor makes its image labels with torch: it returns tensors only)
        inputs = self._processor().process_images([image.convert("RGB")])
        ids = inputs["input_ids"][0].tolist()
        pixels = inputs["pixel_values"][0].numpy()
        if self.qwen:
            grid = inputs["image_grid_thw"][0].numpy()
            return PageImage(ids, pixels[: int(grid[1] * grid[2])], grid)
        return PageImage(ids, pixels)

    def encode(self, batch: Sequence[TokenizedText]) -> list[EncodedItem]:
        return self._embed([len(item.ids) for item in batch], padded(batch, self.pad_id, self.device))

    def encode_images(self, batch: Sequence[PageImage]) -> list[EncodedItem]:
        inputs = padded([TokenizedText(image.ids) for image in batch], self.pad_id, self.device)
        if self.qwen:
            # The model takes each image's patches padded to the batch's most, with the grids that say how many count.
            longest = max(len(image.pixel_values) for image in batch)
            pixels = np.zeros((len(batch), longest, batch[0].pixel_values.shape[1]), dtype=np.float32)
            for row, image in enumerate(batch):
                pixels[row, : len(image.pixel_values)] = image.pixel_values
            grids = np.stack([image.grid for image in batch if image.grid is not None])
            inputs["image_grid_thw"] = torch.from_numpy(grids).to(self.device)
        else:
            pixels = np.stack([image.pixel_values for image in batch])
        inputs["pixel_values"] = torch.from_numpy(pixels).to(self.device, self.model.dtype)
        return self._embed([len(image.ids) for image in batch], inputs)

    def _embed(self, lengths: list[int], inputs: dict[str, torch.Tensor]) -> list[EncodedItem]:
        """Each item's vectors, its padding's dropped. PaliGemma reads token_type_ids (zeros: the whole sequence is
        its prefix, which it attends to both ways); Qwen2-VL takes none."""
        if self.qwen:
            inputs.pop("token_type_ids")
        vectors = self.model(**inputs).embeddings.float().cpu().numpy()
        return [EncodedItem(multivector=vectors[row, :length]) for row, length in enumerate(lengths)]
