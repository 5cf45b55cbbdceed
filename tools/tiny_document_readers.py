"""Tiny random document readers built offline, for tests and benchmarks: a Florence-2 model and a Donut model
(DonutSwin encoder, MBart decoder), each saved with its processor and a small byte-level BPE tokenizer trained here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Image side both processors resize to.
IMAGE_SIZE = 32
DONUT_TASK = "<s_cord-v2>"
# Fields token2json reads; a random decoder may emit them.
DONUT_FIELDS = ("menu", "nm", "price", "total", "question", "answer")
_CORPUS = [
    "What is the text in the image? Describe in detail what is shown. Locate the objects with category name.",
    "invoice total price 12.50 menu item coffee tea cake receipt date store address phone 0123456789",
    "The quick brown fox jumps over the lazy dog. Page one of two, section A: results and notes.",
]


def _tokenizer(extra_special: list[str], vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on a few sentences, with BART's special tokens."""
    specials = ["<s>", "<pad>", "</s>", "<unk>", *extra_special]
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trained.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    trained.train_from_iterator(_CORPUS * 4, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=trained, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def _bart_text(tokenizer: PreTrainedTokenizerFast, vocab: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "d_model": 32,
        "encoder_layers": 2,
        "decoder_layers": 2,
        "encoder_attention_heads": 2,
        "decoder_attention_heads": 2,
        "encoder_ffn_dim": 64,
        "decoder_ffn_dim": 64,
        "max_position_embeddings": 1100,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "decoder_start_token_id": tokenizer.eos_token_id,
    }


def _never_ends(model: Any, eos: int) -> None:
    """Zero the end-of-text row of the output embeddings: its logit is 0, under the best of the random others, so
    a generation runs its max_new_tokens (ended by the forced end-of-text there), as a long page would."""
    with torch.no_grad():
        model.get_output_embeddings().weight[eos].zero_()


def build_tiny_florence2(directory: Path, *, seed: int = 0, generation: dict[str, Any] | None = None) -> Path:
    """A random Florence2ForConditionalGeneration (2-stage DaViT, 2-layer BART), with its processor; `generation`:
    settings of its generation config (the real checkpoints': num_beams 3, no_repeat_ngram_size 3, early_stopping)."""
    from transformers import (
        CLIPImageProcessorPil,
        Florence2Config,
        Florence2ForConditionalGeneration,
        Florence2Processor,
    )

    tokenizer = _tokenizer(["<image>", "<loc_0>", "<loc_1>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer,
        bos_token="<s>",
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": "<image>"},
    )
    # The projector adds one pooled token to the last stage's grid.
    image_tokens = (IMAGE_SIZE // 8) ** 2 + 1
    vision = {
        "depths": [1, 1],
        "patch_size": [7, 3],
        "patch_stride": [4, 2],
        "patch_padding": [3, 1],
        "patch_prenorm": [False, True],
        "embed_dim": [16, 32],
        "num_heads": [2, 2],
        "num_groups": [2, 2],
        "window_size": 2,
        "projection_dim": 32,
        "max_position_embeddings": 8,
        "drop_path_rate": 0.0,
    }
    config = Florence2Config(
        vision_config=vision,
        text_config={"model_type": "bart", **_bart_text(tokenizer, len(tokenizer))},
        image_token_id=tokenizer.image_token_id,
        # Untied output embeddings: tied, a random model repeats its start token for ever.
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Florence2ForConditionalGeneration(config).eval()
    _never_ends(model, tokenizer.eos_token_id)
    for name, value in (generation or {}).items():
        setattr(model.generation_config, name, value)
    model.save_pretrained(directory)
    image_processor = CLIPImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        do_center_crop=False,
        image_seq_length=image_tokens,
    )
    # The parsers the real checkpoints configure, for the tasks the tests ask.
    parsers = {"pure_text": {}, "description_with_bboxes": {}, "ocr": {"AREA_THRESHOLD": 0.0}}
    Florence2Processor(
        image_processor=image_processor, tokenizer=tokenizer, post_processor_config=parsers
    ).save_pretrained(directory)
    return directory


def build_tiny_donut(
    directory: Path, *, seed: int = 0, task: str = DONUT_TASK, extra_tokens: tuple[str, ...] = ()
) -> Path:
    """A random VisionEncoderDecoderModel (2-stage DonutSwin encoder, 2-layer MBart decoder), with a
    DonutProcessor whose tokenizer knows the task token, a few field tokens and `extra_tokens` (RVL-CDIP's
    `<s_class>` and class tokens such as `<letter/>`)."""
    from transformers import (
        DonutImageProcessorPil,
        DonutProcessor,
        DonutSwinConfig,
        MBartConfig,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
    )

    fields = [token for name in DONUT_FIELDS for token in (f"<s_{name}>", f"</s_{name}>")]
    tokenizer = _tokenizer([task, "<sep/>", *fields, *extra_tokens])
    encoder = DonutSwinConfig(
        image_size=IMAGE_SIZE, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=2
    )
    text = _bart_text(tokenizer, len(tokenizer))
    decoder = MBartConfig(**{**text, "is_decoder": True, "add_cross_attention": True, "tie_word_embeddings": False})
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    config.decoder_start_token_id = tokenizer.convert_tokens_to_ids(task)
    torch.manual_seed(seed)
    model = VisionEncoderDecoderModel(config=config).eval()
    _never_ends(model, tokenizer.eos_token_id)
    model.save_pretrained(directory)
    image_processor = DonutImageProcessorPil(
        size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}, do_align_long_axis=False, do_thumbnail=True
    )
    DonutProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(directory)
    return directory


def donut_card_parse(processor: Any, sequence: list[int]) -> Any:
    """The Donut model cards' parse of a generated sequence (prompt included), written out as they give it: the
    reference the tests compare served Donut answers with."""
    text = processor.batch_decode([sequence])[0]
    text = text.replace(processor.tokenizer.eos_token, "").replace(processor.tokenizer.pad_token, "")
    text = re.sub(r"<.*?>", "", text, count=1).strip()  # remove the first task start token
    return processor.token2json(text)
