"""Multimodal processors built without their video processor. transformers' video processors need torchvision, which
the worker does not install (it reads images, never videos), and a processor class that declares one (Qwen3-VL's,
GLM-4.6V's as GLM-OCR loads it) refuses to be built without it, so `AutoProcessor.from_pretrained` fails. Here the
processor is transformers' own class with that one check relaxed, over the checkpoint's tokenizer, its image
processor on the PIL backend (the torchvision backend, which the checkpoint may name, needs torchvision too) and its
saved chat template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoImageProcessor, AutoTokenizer


def without_video(processor_class: type[Any]) -> type[Any]:
    """`processor_class` (a ProcessorMixin) accepting `video_processor=None`."""

    def check_argument_for_proper_class(self: Any, argument_name: str, argument: Any) -> Any:
        if argument is None and argument_name == "video_processor":
            return None
        return processor_class.check_argument_for_proper_class(self, argument_name, argument)

    return type(
        f"{processor_class.__name__}WithoutVideo",
        (processor_class,),
        {"check_argument_for_proper_class": check_argument_for_proper_class},
    )


def image_processor_only(processor_class: type[Any], directory: str | Path) -> Any:
    """The checkpoint's processor as `processor_class` makes it, from local files, with no video processor."""
    directory = Path(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    image_processor = AutoImageProcessor.from_pretrained(directory, local_files_only=True, backend="pil")
    template = saved_chat_template(directory) or tokenizer.chat_template
    if not template:
        raise ValueError("the model directory has no chat template (chat_template.jinja, .json or the tokenizer's)")
    return without_video(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=template
    )


def saved_chat_template(directory: Path) -> str | None:
    """The processor's chat template, as ProcessorMixin.from_pretrained reads it: chat_template.jinja, else
    chat_template.json (older checkpoints); None when neither is there (then the tokenizer's)."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    path = directory / "chat_template.json"
    if not path.is_file():
        return None
    template = json.loads(path.read_text()).get("chat_template")
    return template if isinstance(template, str) else None
