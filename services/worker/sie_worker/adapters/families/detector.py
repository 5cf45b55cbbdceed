"""Open-vocabulary object detection through transformers: GroundingDINO and OWLv2, the object names given per request.

The directory is a transformers checkpoint of either family (the config's `model_type`, `grounding-dino` or
`owlv2`, picks it) with its processor (tokenizer and image processor), run on the image processor's PIL backend
(no torchvision needed). Each image is processed alone, exactly as the processor does it; images of one processed
size run in one forward pass with the request's labels, and the results come from the processor's own
`post_process_grounded_object_detection` with the original image's (height, width) as target size, so boxes are
pixels of the image sent.

The labels become the text the model reads: GroundingDINO reads one prompt, the labels lowercased and each ended
by "." ("a cat. a remote control."), and names each object by the prompt's words its text scores pass
`text_threshold` on; OWLv2 reads each label as a query of its own and names each object by its best label. Labels
the model would not read whole are refused (LABELS_TOO_LONG), never cut.

run_options: `threshold` and (GroundingDINO) `text_threshold`, the defaults when a request sets none; without them,
the post-processing's own defaults (GroundingDINO 0.25 and 0.25, OWLv2 0.1). Request options: `text_threshold`
(GroundingDINO, in [0, 1]) and `max_objects` (objects kept per image, best first: 1 to MAX_OBJECTS, default
DEFAULT_MAX_OBJECTS).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor, PreTrainedModel
from transformers.image_transforms import get_size_with_aspect_ratio
from transformers.image_utils import get_image_size_for_max_height_width

from sie_common.edge.errors import clipped
from sie_worker.adapters.contract import AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import Box, DetectedObject, Extraction
from sie_worker.adapters.spec import AdapterSpec, Option, probability, whole_number

GROUNDING_DINO = "grounding-dino"
OWLV2 = "owlv2"
# The defaults of each family's post_process_grounded_object_detection in transformers.
DEFAULT_THRESHOLDS = {GROUNDING_DINO: 0.25, OWLV2: 0.1}
DEFAULT_TEXT_THRESHOLD = 0.25
# Where GroundingDINO's model ends a phrase of its prompt (with [CLS] and [SEP]: its SPECIAL_TOKENS).
PHRASE_ENDS = (".", "?")
DEFAULT_MAX_OBJECTS = 100
MAX_OBJECTS = 1000
# Label sets whose tokenized text is kept for the next batches of the same labels.
TEXT_CACHE_SIZE = 64


@dataclass(frozen=True)
class ProcessedImage:
    """One image as the processor prepared it, with the size of the image sent."""

    pixel_values: np.ndarray  # [channels, height, width]
    pixel_mask: np.ndarray | None  # [height, width]; GroundingDINO only
    height: int
    width: int


@dataclass(frozen=True)
class RawDetections:
    """One image's model output, as the processor's post-processing reads it."""

    output: Any  # the model's output class, batch of one, float32 on the CPU
    input_ids: torch.Tensor


class ZeroShotDetector(HfAdapter):
    spec = AdapterSpec(
        "zero_shot_detector",
        tasks=("extract",),
        inputs=("image",),
        labels=True,
        options=(
            Option(
                "text_threshold",
                "GroundingDINO: the score a word of the prompt needs to name an object",
                lambda value: probability(value, "text_threshold"),
            ),
            Option(
                "max_objects",
                "objects kept per image, best first",
                lambda value: whole_number(value, "max_objects", 1, MAX_OBJECTS),
            ),
        ),
    )

    model: PreTrainedModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        self.model = self.load(AutoModelForZeroShotObjectDetection)
        self.family = self.model.config.model_type
        if self.family not in DEFAULT_THRESHOLDS:
            raise ValueError(
                f"model type {self.family!r} is not a detector this adapter runs; it runs: "
                f"{', '.join(DEFAULT_THRESHOLDS)}"
            )
        self.processor = AutoProcessor.from_pretrained(
            context.weights, backend="pil", trust_remote_code=context.profile.trust_remote_code
        )
        self.image_processor = self.processor.image_processor
        self._tokenizer_lock = threading.Lock()
        self._texts: OrderedDict[tuple[str, ...], dict[str, torch.Tensor]] = OrderedDict()
        self.max_sequence_length = self._text_limit()
        run_options = context.profile.run_options
        self.threshold = probability(
            run_options.get("threshold", DEFAULT_THRESHOLDS[self.family]), "run_options.threshold"
        )
        self.text_threshold = probability(
            run_options.get("text_threshold", DEFAULT_TEXT_THRESHOLD), "run_options.text_threshold"
        )
        if "text_threshold" in run_options and self.family != GROUNDING_DINO:
            raise ValueError(f"run_options.text_threshold: {self.family} reads no text threshold")

    def _text_limit(self) -> int:
        """The most tokens the model reads of its text: GroundingDINO's whole prompt (it drops what is past
        max_text_len), OWLv2's each label (padded to the processor's width, which must fit the positions)."""
        positions = int(self.model.config.text_config.max_position_embeddings)
        if self.family == GROUNDING_DINO:
            return min(int(self.model.config.max_text_len), positions)
        width = int(self.processor(text=["a"], return_tensors="pt")["input_ids"].shape[1])
        if width > positions:
            raise ValueError(
                f"the processor pads each label to {width} tokens, past the text model's {positions} positions; "
                "set the tokenizer's model_max_length"
            )
        return width

    # -- the request --------------------------------------------------------

    def check(self, query: Query) -> None:
        """Options this family reads (OWLv2 has no text threshold), and the model reads every label whole."""
        if "text_threshold" in query.options and self.family != GROUNDING_DINO:
            raise AdapterError(
                f"options.text_threshold: {self.family} reads no option 'text_threshold'; it reads: max_objects",
                reason="UNKNOWN_OPTION",
                metadata={"option": "text_threshold", "accepted": "max_objects"},
            )
        if self.family == GROUNDING_DINO:
            for index, label in enumerate(query.labels):
                if not label.strip() or any(mark in label for mark in PHRASE_ENDS):
                    raise AdapterError(
                        f"labels[{index}]: {clipped(label)!r}: GroundingDINO reads the labels as one prompt of "
                        "phrases, each ended by '.' or '?', so a label must have a word and neither mark",
                        reason="INVALID_LABEL",
                        metadata={"label": str(index)},
                    )
        self._text(query.labels)

    def _options(self, options: Mapping[str, Any]) -> tuple[float, int]:
        """(text_threshold, max_objects) of a request (their bounds are the spec's)."""
        return float(options.get("text_threshold", self.text_threshold)), int(
            options.get("max_objects", DEFAULT_MAX_OBJECTS)
        )

    def _text(self, labels: tuple[str, ...]) -> dict[str, torch.Tensor]:
        """The tokenized text of `labels` for one image (cached); LABELS_TOO_LONG when the model would not read it
        whole. Thread-safe: one tokenizer call at a time."""
        with self._tokenizer_lock:
            cached = self._texts.get(labels)
            if cached is not None:
                self._texts.move_to_end(labels)
                return cached
            text: str | list[str] = prompt(labels) if self.family == GROUNDING_DINO else list(labels)
            if self.family == GROUNDING_DINO:
                lengths = [("labels: the prompt they make", len(self.processor.tokenizer(text)["input_ids"]))]
            else:
                counts = self.processor.tokenizer(text)["input_ids"]
                lengths = [(f"labels[{index}]", len(ids)) for index, ids in enumerate(counts)]
            for what, length in lengths:
                if length > self.max_sequence_length:
                    raise AdapterError(
                        f"{what} is {length} tokens; {self.family} reads at most {self.max_sequence_length}: "
                        "send fewer or shorter labels (in several requests)",
                        reason="LABELS_TOO_LONG",
                        metadata={"limit": str(self.max_sequence_length), "tokens": str(length)},
                    )
            encoded = dict(self.processor(text=text, return_tensors="pt"))
            self._texts[labels] = encoded
            if len(self._texts) > TEXT_CACHE_SIZE:
                self._texts.popitem(last=False)
            return encoded

    # -- images -------------------------------------------------------------

    def resized_pixels(self, width: int, height: int) -> int:
        return processed_pixels(self.image_processor, self.family, width, height)

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The image in RGB (as transformers' detection pipeline loads it), processed alone."""
        if item.image is None:
            raise ValueError(f"{self.family} detects objects in an image; this item has none")
        image = item.image if item.image.mode == "RGB" else item.image.convert("RGB")
        features = self.image_processor(images=[image], return_tensors="np")
        mask = features.get("pixel_mask")
        processed = ProcessedImage(
            features["pixel_values"][0], None if mask is None else mask[0], height=image.height, width=image.width
        )
        return Prepared(processed, 1)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        """Each image's raw detections; images of one processed size share a forward pass."""
        text = self._text(query.labels)
        by_shape: dict[tuple[int, ...], list[int]] = {}
        for row, image in enumerate(batch):
            by_shape.setdefault(image.pixel_values.shape, []).append(row)
        found: list[Any] = [None] * len(batch)
        for rows in by_shape.values():
            images = [batch[row] for row in rows]
            inputs = {name: value.repeat(len(rows), 1).to(self.device) for name, value in text.items()}
            inputs["pixel_values"] = torch.from_numpy(np.stack([image.pixel_values for image in images])).to(
                self.device, self.model.dtype
            )
            if images[0].pixel_mask is not None:
                inputs["pixel_mask"] = torch.from_numpy(np.stack([image.pixel_mask for image in images])).to(
                    self.device
                )
            output = self.model(**inputs)
            logits, boxes = output.logits.float().cpu(), output.pred_boxes.float().cpu()
            for position, row in enumerate(rows):
                one = type(output)(logits=logits[position : position + 1], pred_boxes=boxes[position : position + 1])
                found[row] = RawDetections(one, text["input_ids"])
        return found

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        """The processor's post-processing at the original size, best first, at most max_objects."""
        text_threshold, max_objects = self._options(query.options)
        threshold = self.threshold if query.threshold is None else query.threshold
        target = [(prepared.height, prepared.width)]
        if not bool((output.output.logits.sigmoid().amax(dim=-1) > threshold).any()):
            # No object passes: GroundingDINO's post-processing would name the none found with one empty label.
            return Extraction()
        if self.family == GROUNDING_DINO:
            with self._tokenizer_lock:  # it decodes the words of each object's label
                result = self.processor.post_process_grounded_object_detection(
                    output.output,
                    output.input_ids,
                    threshold=threshold,
                    text_threshold=text_threshold,
                    target_sizes=target,
                )[0]
        else:
            result = self.processor.post_process_grounded_object_detection(
                output.output, threshold=threshold, target_sizes=target, text_labels=[list(query.labels)]
            )[0]
        found = [
            DetectedObject(label=label, score=float(score), box=Box(*(float(value) for value in box)))
            for score, label, box in zip(
                result["scores"].tolist(), result["text_labels"], result["boxes"].tolist(), strict=True
            )
        ]
        found.sort(key=lambda detected: detected.score, reverse=True)
        return Extraction(objects=found[:max_objects])


def processed_pixels(processor: Any, family: str, width: int, height: int) -> int:
    """The largest image `processor` makes of one of width x height: the resized one (GroundingDINO keeps the aspect
    ratio within its shortest and longest edge), or OWLv2's square, padded to the longer side before it is
    resized (a thin image's square is far larger than the image)."""
    size = processor.size
    resized = width * height
    if processor.do_resize:
        if size.shortest_edge and size.longest_edge:
            new_height, new_width = get_size_with_aspect_ratio((height, width), size.shortest_edge, size.longest_edge)
            resized = new_height * new_width
        elif size.max_height and size.max_width:
            new_height, new_width = get_image_size_for_max_height_width(
                (height, width), size.max_height, size.max_width
            )
            resized = new_height * new_width
        elif size.height and size.width:
            resized = size.height * size.width
    padded = 0
    if processor.do_pad:
        pad_size = getattr(processor, "pad_size", None)
        if family == OWLV2:
            padded = max(width, height) ** 2
        elif pad_size is not None and pad_size.height and pad_size.width:
            padded = pad_size.height * pad_size.width
    return max(resized, padded)


def prompt(labels: Sequence[str]) -> str:
    """GroundingDINO's text for a list of labels, as its processor builds it: "a cat. a remote control."."""
    return ". ".join(label.strip().lower() for label in labels) + "."
