"""A tiny random Qwen3-VL (Qwen3VLForConditionalGeneration: a 2-block vision tower with 16-pixel patches merged 2x2,
a 2-layer Qwen3 decoder with interleaved M-RoPE) built offline, for tests of the Qwen3-VL embedder and reranker,
saved with its processor's parts: a Qwen2-VL image processor, and a small byte-level BPE tokenizer trained here (with
Qwen's chat and vision special tokens, "yes" and "no" single tokens) holding a chat template of the checkpoints'
shape (a system turn, a user turn of images and texts, the assistant's turn opened)."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tiny_ocr_vlms import decoder

# The vision tower's patch side and merge: images are resized to multiples of 32 pixels, as the real ones.
PATCH_SIZE = 16
MERGE_SIZE = 2
_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
_CORPUS = [
    "Represent the user's input. Retrieve images or text relevant to the user's query.",
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. "
    'Note that the answer can only be "yes" or "no".',
    "<Instruct>: Given a search query, retrieve relevant candidates that answer the query. <Query>: <Document>:",
    "A cat sits on a red mat. The weather in Paris is sunny; the invoice total is 12.50 euros. yes no NULL",
]
# The checkpoints' template, in shape: every message a turn; a content list's images as the vision tokens, its
# texts as they are.
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' or 'image' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer() -> PreTrainedTokenizerFast:
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    trained.train_from_iterator(_CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=trained,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )
    for word in ("yes", "no"):
        if tokenizer.convert_tokens_to_ids(word) in (None, tokenizer.unk_token_id):
            raise RuntimeError(f"the replica's vocabulary lacks {word!r} as one token")
    return tokenizer


def build_tiny_qwen3_vl(directory: Path, *, seed: int = 0) -> Path:
    """A random Qwen3VLForConditionalGeneration with its processor in `directory` (weights drawn wider than the
    default, so answers differ between inputs)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tokenizer = _tokenizer()
    ids = {token: tokenizer.get_vocab()[token] for token in _SPECIALS}
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "out_hidden_size": 32,
        "num_position_embeddings": 64,
        "deepstack_visual_indexes": [0],
        "initializer_range": 0.2,
    }
    text = {
        **decoder(len(tokenizer)),
        "max_position_embeddings": 16384,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
        },
        "initializer_range": 0.2,
        "pad_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
    }
    config = Qwen3VLConfig(
        vision_config=vision,
        text_config=text,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    Qwen3VLForConditionalGeneration(config).eval().save_pretrained(directory)
    side = PATCH_SIZE * MERGE_SIZE
    Qwen2VLImageProcessorPil(
        size={"shortest_edge": 4 * side * side, "longest_edge": 64 * side * side},
        patch_size=PATCH_SIZE,
        merge_size=MERGE_SIZE,
        temporal_patch_size=2,
    ).save_pretrained(directory)
    # The processor's parts, saved one by one: Qwen3VLProcessor itself wants a video processor (torchvision).
    tokenizer.chat_template = _CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory
