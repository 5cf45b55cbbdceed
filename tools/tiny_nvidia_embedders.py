"""Tiny random replicas of NVIDIA's decoder embedders, each saved in its checkpoint's own layout.

- NV-Embed (nvidia/NV-Embed-v2): config.json `model_type: nvembed` with `text_config` (`bidir_mistral`) and
  `latent_attention_config`, `auto_map` naming configuration_nvembed / modeling_nvembed; the Mistral decoder's
  weights under `embedding_model.`, the latent-attention layer's under `latent_attention_model.`, in two
  safetensors shards with their index.
- llama-embed-nemotron (nvidia/llama-embed-nemotron-8b): a Llama decoder with config.json `model_type:
  llama_bidirec` (`pooling: avg`, `auto_map` naming llama_bidirectional_model), weights as LlamaModel saves
  them, and its sentence-transformers files (mean pooling, Normalize, query/document prompts).

The modeling files `auto_map` names are not written here: a test that runs the shipped code copies it in.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModel

from tiny_decoders import HIDDEN, build_decoder_embedder, decoder_config, train_tokenizer

# The latent-attention layer of the NV-Embed replica.
LATENTS = 16
CROSS_HEADS = 4
CROSS_HEAD_WIDTH = 8
NV_EMBED_CODE = {
    "AutoConfig": "configuration_nvembed.NVEmbedConfig",
    "AutoModel": "modeling_nvembed.NVEmbedModel",
}
NEMOTRON_CODE = {
    "AutoConfig": "llama_bidirectional_model.LlamaBidirectionalConfig",
    "AutoModel": "llama_bidirectional_model.LlamaBidirectionalModel",
}


def _latent_attention_weights(generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random weights of the layer, by their checkpoint names; LayerNorms away from their identity start."""
    inner = CROSS_HEADS * CROSS_HEAD_WIDTH

    def random(*shape: int, scale: float = 0.2, offset: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale + offset

    return {
        "latents": random(LATENTS, HIDDEN, scale=1.0),
        "cross_attend_blocks.0.norm.weight": random(HIDDEN, offset=1.0),
        "cross_attend_blocks.0.norm.bias": random(HIDDEN),
        "cross_attend_blocks.0.norm_context.weight": random(HIDDEN, offset=1.0),
        "cross_attend_blocks.0.norm_context.bias": random(HIDDEN),
        "cross_attend_blocks.0.fn.to_q.weight": random(inner, HIDDEN),
        "cross_attend_blocks.0.fn.to_kv.weight": random(2 * inner, HIDDEN),
        "cross_attend_blocks.0.fn.to_out.weight": random(HIDDEN, inner),
        "cross_attend_blocks.1.norm.weight": random(HIDDEN, offset=1.0),
        "cross_attend_blocks.1.norm.bias": random(HIDDEN),
        "cross_attend_blocks.1.fn.net.0.weight": random(HIDDEN * 8, HIDDEN),
        "cross_attend_blocks.1.fn.net.0.bias": random(HIDDEN * 8),
        "cross_attend_blocks.1.fn.net.2.weight": random(HIDDEN, HIDDEN * 4),
        "cross_attend_blocks.1.fn.net.2.bias": random(HIDDEN),
    }


def build_nv_embed(directory: Path, *, seed: int = 0, sliding_window: int = 4) -> Path:
    """An NV-Embed replica in `directory`: a 2-layer Mistral (a sliding window shorter than the texts, which the
    reference's padding-only mask ignores) and a latent-attention layer of LATENTS latents."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(directory, template="bos", padding_side="right", seed=seed)
    torch.manual_seed(seed)
    text_config = decoder_config("mistral", tokenizer, sliding_window=sliding_window)
    decoder = AutoModel.from_config(text_config)
    generator = torch.Generator().manual_seed(seed)
    decoder_weights = {f"embedding_model.{key}": value.contiguous() for key, value in decoder.state_dict().items()}
    pooling_weights = {
        f"latent_attention_model.{key}": value for key, value in _latent_attention_weights(generator).items()
    }
    shards = {"model-00001-of-00002.safetensors": decoder_weights, "model-00002-of-00002.safetensors": pooling_weights}
    for name, weights in shards.items():
        save_file(weights, str(directory / name), metadata={"format": "pt"})
    weight_map = {key: name for name, weights in shards.items() for key in weights}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text = {
        **text_config.to_dict(),
        "model_type": "bidir_mistral",
        "architectures": ["MistralModel"],
        # The reference loads its tokenizer from here (the real checkpoint names its own Hub id).
        "_name_or_path": str(directory),
        # The reference's decoder loop predates transformers 5's cache classes.
        "use_cache": False,
    }
    config = {
        "model_type": "nvembed",
        "architectures": ["NVEmbedModel"],
        "auto_map": NV_EMBED_CODE,
        "hidden_size": HIDDEN,
        "padding_side": "right",
        "add_pad_token": True,
        "is_mask_instruction": True,
        "add_eos": True,
        "mask_type": "b",
        "latent_attention_config": {
            "model_type": "latent_attention",
            "num_latents_value": LATENTS,
            "num_cross_heads": CROSS_HEADS,
            "cross_dim_head": CROSS_HEAD_WIDTH,
            "hidden_dim": HIDDEN,
            "latent_dim": HIDDEN,
            "output_normalize": True,
        },
        "text_config": text,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    return directory


def build_llama_embed_nemotron(directory: Path, *, query_prompt: str, seed: int = 0) -> Path:
    """A llama-embed-nemotron replica in `directory`/model: a 2-layer Llama, left padding, mean pooling,
    normalized, prompts {query: query_prompt, document: ""}."""
    model_dir = build_decoder_embedder(
        directory,
        "llama",
        pooling="mean",
        template="bos",
        padding_side="left",
        prompts={"query": query_prompt, "document": ""},
        seed=seed,
    )
    config_file = model_dir / "config.json"
    config = json.loads(config_file.read_text())
    config.update(
        model_type="llama_bidirec",
        architectures=["LlamaBidirectionalModel"],
        auto_map=NEMOTRON_CODE,
        pooling="avg",
        temperature=1.0,
    )
    config_file.write_text(json.dumps(config, indent=2))
    return model_dir
