"""Tiny random replicas of the GTE checkpoints that ship Alibaba-NLP/new-impl's code (`NewModel`), each in its own
layout, with the same weights saved as transformers' native `GteModel` / `GteForMaskedLM` beside it.

A replica is a 2-layer GTE built natively (transformers' GteModel, random weights, LayerNorms away from their identity
start), then written twice:
- `shipped/`: as the Hub repository has it: config.json in new-impl's keys (`model_type: new`, or Snowflake's `gte`,
  with `auto_map`, `architectures`, `rope_theta`, `rope_scaling`, `pack_qkv`, ...) and new-impl's weight names (fused
  `attention.qkv_proj` and `mlp.up_gate_proj`, `encoder.layer.N.attn_ln` / `mlp_ln`, a `new.` prefix under a head);
- `native/`: sentence-transformers' save of the native model (transformers' own config and names), which the tests
  load with sentence-transformers as the reference (their rotary embedding set to new-impl's there).

The modeling files `auto_map` names are not written: nothing here or in the worker may run them.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import GteConfig, GteForMaskedLM, GteModel, PreTrainedModel

from tiny_decoders import _restyle_dense
from tiny_layouts import minilm_tokenizer, opensearch_sparse_encoder

GTE_HIDDEN = 32
GTE_HEADS = 2
GTE_MAX_LENGTH = 128
NEW_IMPL_CODE = {
    "AutoConfig": "Alibaba-NLP/new-impl--configuration.NewConfig",
    "AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel",
    "AutoModelForMaskedLM": "Alibaba-NLP/new-impl--modeling.NewForMaskedLM",
    "AutoModelForTokenClassification": "Alibaba-NLP/new-impl--modeling.NewForTokenClassification",
}
# stella_en_400M_v5 ships its own copy of the code in its repository.
STELLA_CODE = {"AutoConfig": "configuration.NewConfig", "AutoModel": "modeling.NewModel"}


@dataclass(frozen=True)
class GteLayout:
    """What one checkpoint's config.json and weights look like."""

    model_type: str
    architecture: str
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    type_vocab_size: int
    auto_map: dict[str, str]
    # sentence-transformers modules after the Transformer: pooling mode, a Dense width (None: none), Normalize.
    pooling: str = "cls"
    dense: int | None = None
    normalize: bool = True
    prompts: dict[str, str] = field(default_factory=dict)


LAYOUTS = {
    "Alibaba-NLP/gte-multilingual-base": GteLayout(
        "new", "NewForTokenClassification", 20000.0, {"type": "ntk", "factor": 8.0}, 1, NEW_IMPL_CODE
    ),
    "Snowflake/snowflake-arctic-embed-m-v2.0": GteLayout(
        "gte", "GteModel", 160000.0, None, 1, NEW_IMPL_CODE, prompts={"query": "query: ", "document": ""}
    ),
    "NovaSearch/stella_en_400M_v5": GteLayout(
        "new", "NewModel", 160000.0, None, 2, STELLA_CODE, pooling="mean", dense=24, normalize=False
    ),
    "opensearch-project/opensearch-neural-sparse-encoding-doc-v3-gte": GteLayout(
        "new", "NewForMaskedLM", 500000.0, {"type": "ntk", "factor": 2.0}, 0, NEW_IMPL_CODE
    ),
}


@dataclass(frozen=True)
class GteReplica:
    shipped: Path
    native: Path
    layout: GteLayout


def native_config(layout: GteLayout, vocab_size: int, pad_token_id: int) -> GteConfig:
    """The replica's GteConfig, its rotary embedding left at the default on the layout's own base (the reference sets
    new-impl's in place; the worker translates the shipped config)."""
    return GteConfig(
        vocab_size=vocab_size,
        hidden_size=GTE_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=GTE_HEADS,
        intermediate_size=64,
        max_position_embeddings=512,
        type_vocab_size=layout.type_vocab_size,
        pad_token_id=pad_token_id,
        layer_norm_eps=1e-12,
        rope_parameters={"rope_type": "default", "rope_theta": layout.rope_theta},
    )


def _randomized(model: PreTrainedModel, seed: int) -> PreTrainedModel:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator) * 0.2
            parameter.copy_(noise + 1.0 if "layernorm" in name.lower() and name.endswith("weight") else noise)
    return model.eval()


def new_impl_weights(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """A native GTE state dict (GteModel's names, or a head's with `gte.` before them) in new-impl's names, the base
    model's under `prefix`: q/k/v fused into qkv_proj, up and gate into up_gate_proj (in that order)."""
    shipped: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        base = key.removeprefix("gte.")
        if key.startswith("lm_head."):
            shipped[key.replace("lm_head.layer_norm", "lm_head.norm")] = value
            continue
        if not base.startswith("layers."):
            shipped[prefix + base] = value
            continue
        layer, rest = base.removeprefix("layers.").split(".", 1)
        target = f"{prefix}encoder.layer.{layer}."
        if rest.startswith(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj")):
            continue  # fused below, with the first of each group
        suffix = rest.rsplit(".", 1)[1]
        if rest.startswith("self_attn.o_proj"):
            shipped[target + "attention.o_proj." + suffix] = value
        elif rest.startswith("post_attention_layernorm"):
            shipped[target + "attn_ln." + suffix] = value
        elif rest.startswith("post_mlp_layernorm"):
            shipped[target + "mlp_ln." + suffix] = value
        elif rest.startswith("mlp.down_proj"):
            shipped[target + "mlp.down_proj." + suffix] = value
        elif rest == "mlp.up_proj.weight":
            gate = state[key.replace("mlp.up_proj", "mlp.gate_proj")]
            shipped[target + "mlp.up_gate_proj.weight"] = torch.cat([value, gate])
    for key in state:
        if ".self_attn.q_proj." in key:
            layer, suffix = key.removeprefix("gte.").removeprefix("layers.").split(".", 1)[0], key.rsplit(".", 1)[1]
            parts = [state[key.replace("q_proj", name)] for name in ("q_proj", "k_proj", "v_proj")]
            shipped[f"{prefix}encoder.layer.{layer}.attention.qkv_proj.{suffix}"] = torch.cat(parts)
    return {key: value.contiguous() for key, value in shipped.items()}


def new_impl_config(layout: GteLayout, config: Any) -> dict[str, Any]:
    """The config.json new-impl's checkpoints carry for `config`'s sizes."""
    return {
        "architectures": [layout.architecture],
        "auto_map": layout.auto_map,
        "model_type": layout.model_type,
        "attention_probs_dropout_prob": 0.0,
        "classifier_dropout": 0.0,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1,
        "hidden_size": config.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": config.intermediate_size,
        "layer_norm_eps": config.layer_norm_eps,
        "layer_norm_type": "layer_norm",
        "logn_attention_clip1": False,
        "logn_attention_scale": False,
        "max_position_embeddings": config.max_position_embeddings,
        "num_attention_heads": config.num_attention_heads,
        "num_hidden_layers": config.num_hidden_layers,
        "pack_qkv": True,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "rope",
        "rope_scaling": layout.rope_scaling,
        "rope_theta": layout.rope_theta,
        "torch_dtype": "float32",
        "transformers_version": "4.39.1",
        "type_vocab_size": config.type_vocab_size,
        "unpad_inputs": False,
        "use_memory_efficient_attention": False,
        "vocab_size": config.vocab_size,
    }


def _write_shipped(transformer_folder: Path, layout: GteLayout, model: PreTrainedModel, seed: int) -> None:
    """Replace the native save in `transformer_folder` with new-impl's config and weights."""
    config = model.config
    headed = layout.architecture != "NewModel" and layout.architecture != "GteModel"
    weights = new_impl_weights(model.state_dict(), "new." if headed else "")
    if layout.architecture == "NewForMaskedLM":
        weights.pop("lm_head.decoder.weight")  # tied to the word embeddings, as new-impl saves it
    if layout.architecture == "NewForTokenClassification":
        generator = torch.Generator().manual_seed(seed + 1)
        weights["classifier.weight"] = torch.randn(1, config.hidden_size, generator=generator)
        weights["classifier.bias"] = torch.zeros(1)
    for stale in transformer_folder.glob("model*.safetensors*"):
        stale.unlink()
    save_file(weights, str(transformer_folder / "model.safetensors"), metadata={"format": "pt"})
    (transformer_folder / "config.json").write_text(json.dumps(new_impl_config(layout, config), indent=2))


def build_gte(directory: Path, model_id: str, *, seed: int = 0) -> GteReplica:
    """The replica of `model_id` (a LAYOUTS key) under `directory`: `shipped/` and `native/`."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    layout = LAYOUTS[model_id]
    tokenizer = minilm_tokenizer()
    tokenizer.model_max_length = GTE_MAX_LENGTH
    config = native_config(layout, tokenizer.vocab_size, tokenizer.pad_token_id)
    torch.manual_seed(seed)
    masked_lm = layout.architecture == "NewForMaskedLM"
    model = _randomized(GteForMaskedLM(config) if masked_lm else GteModel(config), seed)
    if masked_lm:
        model.tie_weights()
    bare = directory / "bare"
    model.save_pretrained(bare)
    tokenizer.save_pretrained(bare)
    native, shipped = directory / "native", directory / "shipped"
    if masked_lm:
        (directory / "bare" / "idf.json").write_text(json.dumps(_idf(tokenizer, seed)))
        opensearch_sparse_encoder(bare, activation="log1p_relu").save(str(native))
        shutil.copytree(native, shipped)
        folder = next(path.parent for path in shipped.glob("document_*/config.json"))
        _write_shipped(folder, layout, model, seed)
    else:
        transformer = Transformer(str(bare), max_seq_length=GTE_MAX_LENGTH)
        modules: list[torch.nn.Module] = [transformer, Pooling(GTE_HIDDEN, pooling_mode=layout.pooling)]
        if layout.dense is not None:
            torch.manual_seed(seed + 2)
            modules.append(Dense(GTE_HIDDEN, layout.dense, activation_function=torch.nn.Identity()))
        if layout.normalize:
            modules.append(Normalize())
        SentenceTransformer(modules=modules, prompts=layout.prompts, device="cpu").save(str(native))
        if layout.dense is not None:
            _restyle_dense(native, "2_Dense_1024", as_bin=True)  # as stella keeps its Dense module
        shutil.copytree(native, shipped)
        _write_shipped(shipped, layout, model, seed)
    shutil.rmtree(bare)
    return GteReplica(shipped, native, layout)


def _idf(tokenizer: Any, seed: int) -> dict[str, float]:
    """A query weight for every token of the vocabulary (in id order, so the same in every process)."""
    generator = torch.Generator().manual_seed(seed + 3)
    tokens = sorted(tokenizer.get_vocab(), key=tokenizer.convert_tokens_to_ids)
    weights = torch.rand(len(tokens), generator=generator) * 8 + 0.1
    return {token: round(float(weight), 4) for token, weight in zip(tokens, weights, strict=True)}
