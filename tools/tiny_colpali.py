"""Tiny random visual document retrievers (ColPali on PaliGemma, ColQwen2 on Qwen2-VL) with their processors, built
offline for tests: a byte-level BPE tokenizer trained on a few sentences, with the special tokens each processor
writes into its prompts."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

_CORPUS = [
    "Question: what is the revenue of the company in the last quarter of the year?",
    "Query: a table of results, a chart of sales, the title of the page and its figures.",
    "Describe the image. The document shows a report with numbers, names and dates.",
] * 20
# The smallest image sides the tests send go to a few patches: ColQwen2 (patch 14, merge 2) resizes to
# multiples of 28 between these pixel counts.
COLQWEN2_MIN_PIXELS = 28 * 28
COLQWEN2_MAX_PIXELS = 28 * 28 * 6
COLPALI_IMAGE_SIZE = 28
EMBEDDING_DIM = 16


def _tokenizer(special: list[str], **roles: str) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(_CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **roles)


def build_tiny_colpali(directory: Path, *, seed: int = 0) -> Path:
    """A random ColPaliForRetrieval on a 2-layer PaliGemma (SigLIP tower of 4 patches of a 28-pixel square, Gemma of
    width 32), saved with its ColPaliProcessor (PIL SigLIP image processor)."""
    from transformers import (
        ColPaliConfig,
        ColPaliForRetrieval,
        ColPaliProcessor,
        SiglipImageProcessorPil,
    )

    tokenizer = _tokenizer(
        ["<pad>", "<eos>", "<bos>", "<unk>", "<image>"],
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
    )
    image_processor = SiglipImageProcessorPil(size={"height": COLPALI_IMAGE_SIZE, "width": COLPALI_IMAGE_SIZE})
    # ColPaliProcessor reads the image tokens per image from its image processor.
    image_processor.image_seq_length = (COLPALI_IMAGE_SIZE // 14) ** 2  # type: ignore[attr-defined]
    processor = ColPaliProcessor(image_processor, tokenizer)
    vocab = len(processor.tokenizer)
    config = ColPaliConfig(
        vlm_config={
            "model_type": "paligemma",
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "image_size": COLPALI_IMAGE_SIZE,
                "patch_size": 14,
            },
            "text_config": {
                "model_type": "gemma",
                "vocab_size": vocab,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "head_dim": 16,
                "pad_token_id": tokenizer.pad_token_id,
                "bos_token_id": tokenizer.bos_token_id,
                "eos_token_id": tokenizer.eos_token_id,
            },
            "image_token_index": processor.image_token_id,
            "vocab_size": vocab,
            "projection_dim": 32,
            "hidden_size": 32,
        },
        embedding_dim=EMBEDDING_DIM,
    )
    torch.manual_seed(seed)
    ColPaliForRetrieval(config).eval().save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def build_tiny_colqwen2(directory: Path, *, seed: int = 0) -> Path:
    """A random ColQwen2ForRetrieval on a 2-layer Qwen2-VL (vision width 32, text width 32), saved with its
    ColQwen2Processor (PIL Qwen2-VL image processor; dynamic resolution between the pixel bounds above)."""
    from transformers import ColQwen2Config, ColQwen2ForRetrieval, ColQwen2Processor, Qwen2VLImageProcessorPil

    special = [
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<|vision_start|>",
        "<|vision_end|>",
        "<|image_pad|>",
        "<|video_pad|>",
    ]
    tokenizer = _tokenizer(special, pad_token="<|endoftext|>", eos_token="<|im_end|>")
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in special}
    image_processor = Qwen2VLImageProcessorPil(min_pixels=COLQWEN2_MIN_PIXELS, max_pixels=COLQWEN2_MAX_PIXELS)
    processor = ColQwen2Processor(image_processor, tokenizer)
    config = ColQwen2Config(
        vlm_config={
            "model_type": "qwen2_vl",
            "vision_config": {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2},
            "text_config": {
                "model_type": "qwen2_vl_text",
                "vocab_size": len(tokenizer),
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                "pad_token_id": ids["<|endoftext|>"],
                "bos_token_id": ids["<|endoftext|>"],
                "eos_token_id": ids["<|im_end|>"],
            },
            "image_token_id": ids["<|image_pad|>"],
            "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"],
            "vision_end_token_id": ids["<|vision_end|>"],
        },
        embedding_dim=EMBEDDING_DIM,
    )
    torch.manual_seed(seed)
    ColQwen2ForRetrieval(config).eval().save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
