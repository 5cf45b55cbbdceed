"""A tiny random GLM-OCR (`GlmOcrForConditionalGeneration`: a CogViT-style vision encoder with 2D rotary positions and
a GLM decoder with M-RoPE) built offline, for tests. It is saved as zai-org/GLM-OCR is: a `Glm46VProcessor` over a
`Glm46VImageProcessor` (the processor and image processor classes its processor_config.json and
preprocessor_config.json name), a small byte-level BPE tokenizer trained here with GLM's chat and image special tokens,
and a chat template of the checkpoint's shape (`[gMASK]<sop>`, a `<|user|>` turn holding the page between
`<|begin_of_image|>` and `<|end_of_image|>` then the instruction, then `<|assistant|>`). No video processor is saved:
transformers' video processors need torchvision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from tiny_ocr_vlms import bpe, decoder

# The vision encoder's patch side and merge: one image token is a 2 x 2 block of 4-pixel patches (8 x 8 pixels).
PATCH_SIZE = 4
MERGE_SIZE = 2
# The image processor's pixel range, counted as its smart_resize counts it (both temporal frames): 8 to 128 image
# tokens of 8 x 8 pixels, so a page is resized to hold 4 to 64 of them.
MIN_PIXELS = 8 * 64
MAX_PIXELS = 128 * 64
SPECIALS = [
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
]
CHAT_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}{% if message['role'] == 'user' %}<|user|>\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|>\n{% else %}<|system|>\n{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|begin_of_image|><|image|><|end_of_image|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a few sentences, GLM's special tokens first in its vocabulary."""
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe(SPECIALS),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=SPECIALS,
    )


def build_tiny_glm_ocr(directory: Path, *, seed: int = 0, generation: dict[str, Any] | None = None) -> Path:
    """A random GlmOcrForConditionalGeneration (2-layer vision encoder, 2-layer GLM decoder with M-RoPE, and the
    checkpoint's multi-token-prediction layer stored beside them) with a Glm46VProcessor; its generation config ends
    at `<|endoftext|>` or `<|user|>`, as the checkpoint's does;
    `generation`: settings of its generation config. Weights drawn wider than the default, so greedy answers vary."""
    from transformers import GlmOcrConfig, GlmOcrForConditionalGeneration

    tokenizer = _tokenizer()
    ids = {token: int(tokenizer.get_vocab()[token]) for token in SPECIALS}
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "out_hidden_size": 32,
        "image_size": 32,
        "rope_parameters": {"rope_type": "axial", "rope_theta": 10000.0},
    }
    text = {
        **decoder(len(tokenizer)),
        "pad_token_id": ids["<|endoftext|>"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "mrope_section": [2, 3, 3],
            "partial_rotary_factor": 1.0,
        },
        "initializer_range": 0.2,
    }
    config = GlmOcrConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )
    config.initializer_range = 0.2
    torch.manual_seed(seed)
    model = GlmOcrForConditionalGeneration(config).eval()
    model.generation_config.eos_token_id = [ids["<|endoftext|>"], ids["<|user|>"]]
    model.generation_config.pad_token_id = ids["<|endoftext|>"]
    for name, value in (generation or {}).items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(directory)
    _with_next_token_layer(directory / "model.safetensors")
    tokenizer.save_pretrained(directory)
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    preprocessor = {
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
        "do_rescale": True,
        "patch_size": PATCH_SIZE,
        "temporal_patch_size": 2,
        "merge_size": MERGE_SIZE,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "image_processor_type": "Glm46VImageProcessor",
        "processor_class": "Glm46VProcessor",
    }
    (directory / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    (directory / "processor_config.json").write_text(json.dumps({"processor_class": "Glm46VProcessor"}, indent=2))
    return directory


def _with_next_token_layer(weights: Path) -> None:
    """The checkpoint's multi-token-prediction layer (`num_nextn_predict_layers: 1`), stored as decoder layer 16 after
    its 16 layers: weights transformers' GlmOcr classes skip on load. A few of its tensors, so a replica loads with
    them as the checkpoint does."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(weights)
    hidden = tensors["model.language_model.embed_tokens.weight"].shape[1]
    for name in ("eh_proj.weight", "self_attn.q_proj.weight", "mlp.down_proj.weight"):
        tensors[f"model.language_model.layers.16.{name}"] = torch.randn(hidden, hidden)
    save_file(tensors, weights, metadata={"format": "pt"})
