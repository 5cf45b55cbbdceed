"""CLIP-style dual encoders (CLIP, SigLIP) through `transformers`: a text tower
and an image tower that project into one embedding space.

The directory is a transformers checkpoint (AutoModel with
`get_text_features` / `get_image_features`), its tokenizer and its image
processor config (`preprocessor_config.json`), run through the processor's
PIL backend: resize, crop and normalize exactly as the model was trained.
Text is right-padded to the batch's longest item with an attention mask,
except for SigLIP and SigLIP 2, which read the last position and were trained
on text padded to its maximum length without a mask (big_vision's text
encoder takes no mask): padded on the tokenizer's own side, no mask. load_options: `normalize`
(default true: L2-normalized embeddings), `text_padding` (`longest` or
`max_length`, overriding the model type's default).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModel, PreTrainedModel

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, TokenizedText
from sie_worker.adapters.layers.padding import padded
from sie_worker.adapters.layers.slow_tokenizer import text_tokenizer
from sie_worker.adapters.spec import AdapterSpec

TEXT_PADDINGS = ("longest", "max_length")
# Model types trained on text padded to the maximum length, read at the last position.
_MAX_LENGTH_PADDED = ("siglip", "siglip2")


class DualEncoder(HfAdapter):
    spec = AdapterSpec("clip", tasks=("encode", "score"), inputs=("text", "image"), outputs=("dense",))

    model: PreTrainedModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        load_options = dict(context.profile.load_options)
        self.model = self.load(AutoModel)
        if not (hasattr(self.model, "get_text_features") and hasattr(self.model, "get_image_features")):
            raise ValueError(
                f"{type(self.model).__name__} is not a dual encoder: it lacks get_text_features / get_image_features"
            )
        self.normalized = bool(load_options.get("normalize", True))
        model_type = self.model.config.model_type
        self.text_padding: str = load_options.get(
            "text_padding", "max_length" if model_type in _MAX_LENGTH_PADDED else "longest"
        )
        if self.text_padding not in TEXT_PADDINGS:
            raise ValueError(f"text_padding {self.text_padding!r} is not one of {', '.join(TEXT_PADDINGS)}")
        self.tokenizer = text_tokenizer(context.weights, context.config.max_sequence_length, self.model.text_model)
        self.max_sequence_length = self.tokenizer.max_length
        self.image_processor = AutoImageProcessor.from_pretrained(context.weights, backend="pil")

        text_config = self.model.config.text_config
        projected = getattr(self.model.config, "projection_dim", None) or getattr(text_config, "projection_size", None)
        self.dims = context.config.dims or projected or text_config.hidden_size
        if self.dims != (projected or text_config.hidden_size):
            raise ValueError(
                f"config says dims {self.dims}, but the model embeds in {projected or text_config.hidden_size}"
            )

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        """Texts tokenized after the request's instruction (`a photo of `); an image processed, at a cost of 1 (every
        image is processed to one size)."""
        if query.modality == "image":
            return [Prepared(self.prepare_image(item.decoded_image()), 1) for item in items]
        prompt = self.prompt(query)
        tokenized = self.tokenizer.encode([prompt + (item.text or "") for item in items])
        return [Prepared(TokenizedText(item.ids), len(item.ids)) for item in tokenized]

    def run(self, batch: Sequence[Any], query: Query) -> list[EncodedItem]:
        return self.encode_images(batch) if query.modality == "image" else self.encode(batch)

    def resized_pixels(self, width: int, height: int) -> int:
        """A fixed height and width, or the short edge scaled to `shortest_edge` (the long edge then grows with the
        aspect ratio: what makes a 1 x 1,000,000 image a bomb). Processors that resize otherwise are counted at the
        image's own size."""
        size = self.image_processor.size
        if not self.image_processor.do_resize:
            return width * height
        if size.height and size.width:
            return size.height * size.width
        if size.shortest_edge:
            scale = size.shortest_edge / max(min(width, height), 1)
            return round(width * scale) * round(height * scale)
        return width * height

    def prepare_image(self, image: Image.Image) -> np.ndarray:
        return self.image_processor(images=[image], return_tensors="np")["pixel_values"][0]

    def encode(self, batch: Sequence[TokenizedText]) -> list[EncodedItem]:
        # max_length: on the tokenizer's own padding side (Gemma's, SigLIP 2's tokenizer, pads on the left), so the
        # ids are those of tokenizer(texts, padding="max_length"); no attention mask, as SigLIP was trained.
        left = self.text_padding == "max_length" and self.tokenizer.hf.padding_side == "left"
        inputs = padded(batch, self.tokenizer.pad_id, self.device, left=left)
        if self.text_padding == "max_length":
            ids = inputs["input_ids"]
            fill = self.max_sequence_length - ids.shape[1]
            sides = (fill, 0) if left else (0, fill)
            text_inputs = {"input_ids": torch.nn.functional.pad(ids, sides, value=self.tokenizer.pad_id)}
        else:
            text_inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
        # torch types a module's attributes as Tensor | Module
        return self._dense(self.model.get_text_features(**text_inputs))  # type: ignore[operator]

    def encode_images(self, batch: Sequence[np.ndarray]) -> list[EncodedItem]:
        pixels = torch.from_numpy(np.stack(batch)).to(self.device, self.model.dtype)
        # torch types a module's attributes as Tensor | Module
        return self._dense(self.model.get_image_features(pixel_values=pixels))  # type: ignore[operator]

    def _dense(self, output: Any) -> list[EncodedItem]:
        # transformers 5 returns the projected features as pooler_output of a model output.
        features = output if isinstance(output, torch.Tensor) else output.pooler_output
        if self.normalized:
            features = torch.nn.functional.normalize(features.float(), p=2, dim=-1)
        return [EncodedItem(dense=row) for row in features.float().cpu().numpy()]
