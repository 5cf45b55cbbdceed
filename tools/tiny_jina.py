"""A tiny random replica of jinaai/jina-reranker-v2-base-multilingual in its own layout, with the same weights saved
as transformers' native `XLMRobertaForSequenceClassification` beside it.

The checkpoint runs jinaai's XLM-RoBERTa code (flash-attention's BERT): its config.json names no model type, only
`auto_map` (configuration_xlm_roberta.XLMRobertaFlashConfig, modeling_xlm_roberta.XLMRobertaForSequenceClassification)
and `position_embedding_type: absolute`, `use_flash_attn`; its weights are `roberta.emb_ln`,
`roberta.encoder.layers.N.mixer.Wqkv` (q, k, v fused) / `mixer.out_proj`, `norm1`, `mlp.fc1` / `fc2`, `norm2`, and
`classifier.dense` / `out_proj`. The replica is built natively (random weights, LayerNorms away from their identity
start) and written twice: `native/` (save_pretrained) and `shipped/` (that layout). The code files `auto_map` names
are not written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, XLMRobertaConfig, XLMRobertaForSequenceClassification

from tiny_families import build_tiny_bge_m3

JINA_RERANKER_CODE = {
    "AutoConfig": "configuration_xlm_roberta.XLMRobertaFlashConfig",
    "AutoModel": "modeling_xlm_roberta.XLMRobertaModel",
    "AutoModelForSequenceClassification": "modeling_xlm_roberta.XLMRobertaForSequenceClassification",
}
JINA_MAX_LENGTH = 64
# XLM-RoBERTa's layer names (after `encoder.layer.N.`) -> the flash code's (after `encoder.layers.N.`).
_FLASH_NAMES = {
    "attention.output.dense.": "mixer.out_proj.",
    "attention.output.LayerNorm.": "norm1.",
    "intermediate.dense.": "mlp.fc1.",
    "output.dense.": "mlp.fc2.",
    "output.LayerNorm.": "norm2.",
}


@dataclass(frozen=True)
class JinaReplica:
    shipped: Path
    native: Path


def flash_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An XLM-RoBERTa state dict under jinaai's flash names, each layer's query/key/value fused into Wqkv."""
    flash: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".embeddings.LayerNorm." in key:
            flash[key.replace(".embeddings.LayerNorm.", ".emb_ln.")] = value
        elif ".encoder.layer." not in key:
            flash[key] = value
        elif ".attention.self." in key:
            if ".attention.self.query." in key:
                parts = [state[key.replace(".query.", f".{name}.")] for name in ("query", "key", "value")]
                target = key.replace(".encoder.layer.", ".encoder.layers.").replace(
                    ".attention.self.query.", ".mixer.Wqkv."
                )
                flash[target] = torch.cat(parts)
        else:
            head, rest = key.split(".encoder.layer.", 1)
            index, name = rest.split(".", 1)
            native = next(prefix for prefix in _FLASH_NAMES if name.startswith(prefix))
            flash[f"{head}.encoder.layers.{index}.{_FLASH_NAMES[native]}{name.removeprefix(native)}"] = value
    return {key: value.contiguous() for key, value in flash.items()}


def shipped_config(config: XLMRobertaConfig) -> dict[str, Any]:
    """The config.json jinaai's reranker ships for `config`'s sizes."""
    return {
        "architectures": ["XLMRobertaForSequenceClassification"],
        "attention_probs_dropout_prob": 0.1,
        "auto_map": JINA_RERANKER_CODE,
        "bos_token_id": 0,
        "classifier_dropout": None,
        "emb_pooler": None,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": config.hidden_size,
        "num_labels": 1,
        "id2label": {"0": "LABEL_0"},
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "label2id": {"LABEL_0": 0},
        "layer_norm_eps": config.layer_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "output_past": True,
        "pad_token_id": 1,
        "position_embedding_type": "absolute",
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.0",
        "type_vocab_size": 1,
        "use_cache": False,
        "use_flash_attn": True,
        "vocab_size": config.vocab_size,
    }


def build_jina_reranker(directory: Path, *, seed: int = 0) -> JinaReplica:
    """The replica under `directory`: `shipped/` and `native/`."""
    build_tiny_bge_m3(directory / "tokenizer", seed=seed)  # an XLM-RoBERTa Unigram tokenizer, trained offline
    tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
    tokenizer.model_max_length = JINA_MAX_LENGTH
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=JINA_MAX_LENGTH + 2,
        type_vocab_size=1,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        layer_norm_eps=1e-5,
    )
    config.num_labels = 1
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(noise + 1.0 if "LayerNorm.weight" in name else noise)
    native, shipped = directory / "native", directory / "shipped"
    model.save_pretrained(native)
    tokenizer.save_pretrained(native)
    shipped.mkdir()
    tokenizer.save_pretrained(shipped)
    save_file(flash_weights(model.state_dict()), str(shipped / "model.safetensors"), metadata={"format": "pt"})
    (shipped / "config.json").write_text(json.dumps(shipped_config(config), indent=2))
    shutil.rmtree(directory / "tokenizer")
    return JinaReplica(shipped, native)
