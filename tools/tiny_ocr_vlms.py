"""Tiny random OCR vision-language models built offline, for tests: LightOnOCR (Pixtral vision encoder, Qwen3
decoder) and PaddleOCR-VL (a NaViT-style SigLIP encoder, an ERNIE-4.5 decoder with M-RoPE), each saved with its own
processor class, a small byte-level BPE tokenizer trained here and a chat template of the checkpoint's shape (a user
turn holding the page image and the instruction, then the assistant's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Longest side the image processor resizes a page to, and the vision encoder's patch side.
LONGEST_EDGE = 32
PATCH_SIZE = 4
_CORPUS = [
    "Invoice total 12.50 coffee tea cake receipt date store address phone 0123456789",
    "The quick brown fox jumps over the lazy dog. Page one of two, section A: results and notes.",
    "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nText with **bold** and $x^2$.",
]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}[IMG]"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_PADDLE_CHAT_TEMPLATE = (
    "<|begin_of_sentence|>{% for message in messages %}{% if message['role'] == 'user' %}User: "
    "{% else %}Assistant: {% endif %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}\n{% endfor %}{% if add_generation_prompt %}Assistant: {% endif %}"
)
_PADDLE_SPECIALS = [
    "<unk>",
    "<s>",
    "</s>",
    "<|begin_of_sentence|>",
    "<|IMAGE_PLACEHOLDER|>",
    "<|IMAGE_START|>",
    "<|IMAGE_END|>",
    "<|video_pad|>",
]


def bpe(specials: list[str]) -> Tokenizer:
    """A byte-level BPE model trained on a few sentences, with `specials` first in its vocabulary."""
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    trained.train_from_iterator(_CORPUS * 4, trainer)
    return trained


def decoder(vocab_size: int) -> dict[str, Any]:
    """The decoders' size: 2 layers of 32, 2 heads sharing one key-value head."""
    return {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "max_position_embeddings": 2048,
    }


def _tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with the chat and image special tokens LightOnOCR's processor reads."""
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[IMG]", "[IMG_BREAK]", "[IMG_END]"]),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "[IMG]",
            "image_break_token": "[IMG_BREAK]",
            "image_end_token": "[IMG_END]",
        },
    )


def build_tiny_lighton_ocr(directory: Path, *, seed: int = 0, generation: dict[str, Any] | None = None) -> Path:
    """A random LightOnOcrForConditionalGeneration (2-layer Pixtral encoder, 2-layer Qwen3 decoder) with a
    LightOnOcrProcessor; `generation`: settings of its generation config."""
    from transformers import (
        LightOnOcrConfig,
        LightOnOcrForConditionalGeneration,
        LightOnOcrProcessor,
        PixtralImageProcessor,
    )

    tokenizer = _tokenizer()
    vision = {
        "model_type": "pixtral",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "head_dim": 16,
        "image_size": LONGEST_EDGE,
        "patch_size": PATCH_SIZE,
    }
    text = {
        "model_type": "qwen3",
        **decoder(len(tokenizer)),
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
    }
    config = LightOnOcrConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=tokenizer.image_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LightOnOcrForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    for name, value in (generation or {}).items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(directory)
    image_processor = PixtralImageProcessor(
        size={"longest_edge": LONGEST_EDGE}, patch_size={"height": PATCH_SIZE, "width": PATCH_SIZE}
    )
    LightOnOcrProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        spatial_merge_size=2,
        chat_template=_CHAT_TEMPLATE,
    ).save_pretrained(directory)
    return directory


def build_tiny_paddleocr_vl(directory: Path, *, seed: int = 0, generation: dict[str, Any] | None = None) -> Path:
    """A random PaddleOCRVLForConditionalGeneration (2-layer vision encoder, 2-layer ERNIE-4.5 decoder with M-RoPE)
    with a PaddleOCRVLProcessor (pages resized to whole merged 8-pixel patches, 256 to 4,096 pixels);
    `generation`: settings of its generation config. Weights drawn wider than the default, so greedy answers vary."""
    from transformers import PaddleOCRVLConfig, PaddleOCRVLForConditionalGeneration, PaddleOCRVLProcessor
    from transformers.models.paddleocr_vl.image_processing_pil_paddleocr_vl import PaddleOCRVLImageProcessorPil

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe(_PADDLE_SPECIALS),
        eos_token="</s>",
        pad_token="<unk>",
        bos_token="<s>",
        extra_special_tokens={"image_token": "<|IMAGE_PLACEHOLDER|>"},
    )
    ids = {token: tokenizer.get_vocab()[token] for token in _PADDLE_SPECIALS}
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": LONGEST_EDGE,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": 2,
    }
    text = {
        **decoder(len(tokenizer)),
        "eos_token_id": ids["</s>"],
        "pad_token_id": ids["<unk>"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": [2, 3, 3]},
        "initializer_range": 0.2,
    }
    config = PaddleOCRVLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<|IMAGE_PLACEHOLDER|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|IMAGE_START|>"],
        vision_end_token_id=ids["<|IMAGE_END|>"],
        tie_word_embeddings=False,
    )
    config.initializer_range = 0.2
    torch.manual_seed(seed)
    model = PaddleOCRVLForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = ids["</s>"]
    model.generation_config.pad_token_id = ids["<unk>"]
    for name, value in (generation or {}).items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(directory)
    side = PATCH_SIZE * 2
    image_processor = PaddleOCRVLImageProcessorPil(
        size={"shortest_edge": 4 * side * side, "longest_edge": 64 * side * side},
        patch_size=PATCH_SIZE,
        merge_size=2,
        temporal_patch_size=1,
    )
    PaddleOCRVLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=_PADDLE_CHAT_TEMPLATE
    ).save_pretrained(directory)
    return directory
