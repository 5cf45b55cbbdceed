"""Checkpoints whose config names a model type of their own code (`auto_map`) over weights a transformers class
reads as they are (or renamed by transformers' own conversion mapping): served by that class, so no code shipped
with the weights runs.

| model type | shipped by | served as |
| --- | --- | --- |
| `llama_bidirec` | nvidia/llama-embed-nemotron-8b (`LlamaBidirectionalModel`) | `LlamaModel`, bidirectional |
| `bidir_mistral` | NV-Embed's decoder (`BidirectionalMistralModel`, in `text_config`) | `MistralModel`, bidirectional |
| `new` | Alibaba-NLP/new-impl (`NewModel`, `NewForMaskedLM`, `NewForTokenClassification`) | GTE, the same head |
| `gte` with `auto_map` | new-impl's code under transformers' type name (Snowflake's arctic-embed-m-v2.0) | the same |
| none (`auto_map`: `XLMRobertaFlashConfig`) | jinaai's XLM-RoBERTa, absolute positions (jina-reranker-v2) | XLM-R |

The first two's code subclasses the transformers model only to take the causal mask away, which the worker's own
switch does (sie_worker.kernels.bidirectional, checked at load by a probe); their extra config keys (`pooling`,
`temperature`) are what the sentence-transformers files beside them say again.

new-impl's weights (fused `qkv_proj` and `up_gate_proj`, a `new.` prefix under a head) are renamed and split by
transformers' conversion mapping for `gte`; its config is translated here (`gte_settings`): everything but the rotary
embedding carries over, and its fixed-NTK rotary scaling (`rope_scaling: {type: ntk, factor: f}`: base θ·f, every
frequency then divided by f^(2/d), d the head width) is exactly transformers' `linear` rope on base θ·f with factor
f^(2/d). Settings new-impl has and GteModel does not compute (log-n attention scaling, mixed-NTK, separate q/k/v
weights, RMSNorm, absolute positions, another activation than GELU) are refused at load rather than served
differently.

jinaai's XLM-RoBERTa (`XLMRobertaFlashConfig`: flash-attention's BERT with its own names, `emb_ln`,
`encoder.layers.N.mixer.Wqkv` / `out_proj`, `norm1`, `mlp.fc1` / `fc2`, `norm2`; its config names no model type) with
absolute positions is transformers' XLM-RoBERTa layer for layer (post-LayerNorm blocks, exact or tanh GELU, positions
counted from the padding index + 1): its weights are renamed and the fused q/k/v split here
(`xlm_roberta_flash_weights`).
Its rotary variant (jina-colbert-v2, jina-embeddings-v3) and LoRA adapters are refused.

A config's odd values fail the load with a ValueError naming the key, before any model is built: a rotary base or
factor that is no finite number (or overflows when multiplied), a size that is no positive whole number, a head count
that does not divide the width, and more layers than the checkpoint's safetensors weights hold (`check_layer_count`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import CONFIG_MAPPING, AutoModel, PretrainedConfig, PreTrainedModel

from sie_worker.adapters.layers.checkpoint_files import read_json

# Keys of a checkpoint's config that name its own code, not settings of the native class.
_OWN_CODE_KEYS = ("model_type", "auto_map", "architectures")
# new-impl's NewConfig: its rope defaults, and the keys translated or checked here (or only runtime switches of its
# own code: unpadding and xformers) rather than handed to GteConfig.
NEW_IMPL_ROPE_THETA = 10000.0
_NEW_IMPL_KEYS = (
    "rope_theta",
    "rope_scaling",
    "position_embedding_type",
    "pack_qkv",
    "layer_norm_type",
    "logn_attention_scale",
    "logn_attention_clip1",
    "unpad_inputs",
    "use_memory_efficient_attention",
)


def _shared_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint's config as the native class's settings: every key but those naming its own code."""
    return {key: value for key, value in raw.items() if key not in _OWN_CODE_KEYS}


def new_impl_rope(raw: dict[str, Any]) -> dict[str, Any]:
    """new-impl's rotary embedding as transformers' rope parameters (see the module docstring)."""
    given = raw.get("rope_theta", NEW_IMPL_ROPE_THETA)
    theta = _finite(given)
    if theta is None or theta <= 0:
        raise ValueError(f"rope_theta {_finite(given, given)!r}: a rotary base must be a positive number")
    scaling = raw.get("rope_scaling")
    if scaling is None:
        return {"rope_type": "default", "rope_theta": theta}
    factor = _finite(scaling.get("factor")) if isinstance(scaling, dict) else None
    if (
        not isinstance(scaling, dict)
        or scaling.get("type") != "ntk"
        or scaling.get("mixed_b") is not None
        or factor is None
        or factor < 1
    ):
        raise ValueError(
            f"rope_scaling {scaling!r}: the native GTE serves new-impl's fixed NTK scaling only "
            '({"type": "ntk", "factor": f}, f >= 1); trust the shipped code (load_options.trust_remote_code) to '
            "run it as it is"
        )
    if not math.isfinite(theta * factor):
        raise ValueError(
            f"rope_theta {theta!r} times rope_scaling's factor {factor!r} is past a float's range: no rotary base"
        )
    head_width = _head_width(raw)
    return {"rope_type": "linear", "rope_theta": theta * factor, "factor": factor ** (2 / head_width)}


def _finite(value: object, otherwise: object = None) -> Any:
    """A JSON number as a finite float, else `otherwise` (`true` is no number, though Python counts bool an int; an
    integer past a float's range is none either)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return otherwise
    try:
        number = float(value)
    except OverflowError:
        return otherwise
    return number if math.isfinite(number) else otherwise


# The sizes a config may leave out: NewConfig's, GteConfig's and XLMRobertaConfig's defaults alike.
_SIZE_DEFAULTS = {"hidden_size": 768, "num_attention_heads": 12}


def _head_width(raw: dict[str, Any]) -> int:
    """hidden_size / num_attention_heads, each a positive whole number, one dividing the other (ValueError naming the
    key otherwise)."""
    sizes = {key: raw.get(key, default) for key, default in _SIZE_DEFAULTS.items()}
    for key, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} {value!r}: config.json must give a positive whole number")
    hidden, heads = sizes["hidden_size"], sizes["num_attention_heads"]
    if hidden % heads:
        raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return hidden // heads


def gte_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """new-impl's NewConfig as GteConfig's settings; ValueError for what GteModel does not compute."""
    # GteForMaskedLM's head computes GELU whatever the config says.
    required = {
        "position_embedding_type": "rope",
        "layer_norm_type": "layer_norm",
        "pack_qkv": True,
        "hidden_act": "gelu",
    }
    for key, value in required.items():
        if raw.get(key, value) != value:
            raise ValueError(f"{key} {raw[key]!r}: the native GTE serves {key} {value!r} only")
    for key in ("logn_attention_scale", "logn_attention_clip1"):
        if raw.get(key):
            raise ValueError(f"{key}: the native GTE has no log-n attention scaling")
    _head_width(raw)
    settings = {key: value for key, value in _shared_settings(raw).items() if key not in _NEW_IMPL_KEYS}
    return {**settings, "rope_parameters": new_impl_rope(raw)}


# jinaai's XLMRobertaFlashConfig: keys of its own code (flash kernels, pooling of its encode, truncation) that
# XLMRobertaConfig does not read, or that are checked here.
_XLM_ROBERTA_FLASH_KEYS = (
    "use_flash_attn",
    "emb_pooler",
    "matryoshka_dimensions",
    "truncate_dim",
    "task_instructions",
    "load_trained_adapters",
    "lora_adaptations",
    "lora_rank",
    "lora_dropout_p",
    "lora_alpha",
    "lora_main_params_trainable",
    "rotary_emb_base",
    "use_reentrant",
    "fused_bias_fc",
    "fused_mlp",
    "fused_dropout_add_ln",
    "mlp_checkpoint_lvl",
    "torch_dtype",
)
# Its tanh-approximated GELUs (all computed as torch's tanh GELU by its MLP).
_TANH_GELUS = ("gelu_new", "gelu_fast", "gelu_pytorch_tanh")
# Its layers' weight names (after `encoder.layers.N.`) -> XLM-RoBERTa's (after `encoder.layer.N.`).
_XLM_ROBERTA_FLASH_LAYER_NAMES = {
    "mixer.out_proj.": "attention.output.dense.",
    "norm1.": "attention.output.LayerNorm.",
    "mlp.fc1.": "intermediate.dense.",
    "mlp.fc2.": "output.dense.",
    "norm2.": "output.LayerNorm.",
}
_FLASH_LAYER = re.compile(r"^(.*)encoder\.layers\.(\d+)\.(.+)$")


def xlm_roberta_flash_settings(raw: dict[str, Any]) -> dict[str, Any]:
    """jinaai's XLMRobertaFlashConfig as XLMRobertaConfig's settings; ValueError for what XLM-RoBERTa does not
    compute."""
    # Said outright: the default differs between versions of that code (absolute, later rotary).
    if raw.get("position_embedding_type") != "absolute":
        raise ValueError(
            f"position_embedding_type {raw.get('position_embedding_type')!r}: jinaai's XLM-RoBERTa is served "
            "natively with absolute positions only; trust the shipped code (load_options.trust_remote_code) to run "
            "it as it is"
        )
    if raw.get("lora_adaptations") or raw.get("last_layer_subset"):
        raise ValueError("LoRA adaptations or a last-layer subset: jinaai's XLM-RoBERTa has no native form of them")
    activation = raw.get("hidden_act", "gelu")
    if activation != "gelu" and activation not in _TANH_GELUS:
        raise ValueError(f"hidden_act {activation!r}: jinaai's XLM-RoBERTa computes GELU only")
    _head_width(raw)
    vocabulary, padding = raw.get("vocab_size", 30522), raw.get("pad_token_id", 1)  # XLMRobertaConfig's defaults
    if not isinstance(vocabulary, int) or not isinstance(padding, int) or not 0 <= padding < vocabulary:
        raise ValueError(f"pad_token_id {padding!r}: must be a token of the vocabulary (vocab_size {vocabulary!r})")
    settings = {key: value for key, value in _shared_settings(raw).items() if key not in _XLM_ROBERTA_FLASH_KEYS}
    return {**settings, "hidden_act": "gelu" if activation == "gelu" else "gelu_pytorch_tanh"}


def xlm_roberta_flash_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The safetensors weights of jinaai's XLM-RoBERTa in `directory` under XLM-RoBERTa's names, each layer's fused
    `mixer.Wqkv` split into query, key and value (its rows are q, k, v, each heads x head width)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{directory}: no safetensors weights (jinaai's XLM-RoBERTa is read from them)")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        for key, value in load_file(str(file)).items():
            weights.update(_xlm_roberta_names(key, value))
    return weights


def _xlm_roberta_names(key: str, value: torch.Tensor) -> dict[str, torch.Tensor]:
    if key.endswith(("emb_ln.weight", "emb_ln.bias")):
        return {key.replace("emb_ln.", "embeddings.LayerNorm."): value}
    layer = _FLASH_LAYER.match(key)
    if layer is None:
        return {key: value}
    prefix, index, rest = layer.groups()
    target = f"{prefix}encoder.layer.{index}."
    if rest.startswith("mixer.Wqkv."):
        suffix = rest.removeprefix("mixer.Wqkv.")
        query, key_part, value_part = value.chunk(3, dim=0)
        return {
            f"{target}attention.self.query.{suffix}": query,
            f"{target}attention.self.key.{suffix}": key_part,
            f"{target}attention.self.value.{suffix}": value_part,
        }
    for flash, native in _XLM_ROBERTA_FLASH_LAYER_NAMES.items():
        if rest.startswith(flash):
            return {target + native + rest.removeprefix(flash): value}
    return {key: value}


@dataclass(frozen=True)
class NativeLoader:
    """Stands in for a transformers Auto class (its `from_pretrained`) for one checkpoint: the native class that
    `auto_class` maps the config given to, weight names renamed by `key_mapping` (regular expression ->
    replacement) after transformers' own conversion mapping for the model type. Weights the class expects and the
    checkpoint lacks fail the load (ValueError), rather than being left at random values."""

    config: PretrainedConfig
    key_mapping: dict[str, str] | None = None
    auto_class: Any = AutoModel
    # Reads the directory's weights under the native class's names, where transformers has no conversion for them.
    weights: Callable[[Path], dict[str, torch.Tensor]] | None = None

    def from_pretrained(self, directory: Path, *, trust_remote_code: bool = False, **kwargs: Any) -> PreTrainedModel:
        """The model of `directory`; `kwargs` go to the class's from_pretrained. Never runs the directory's code
        (`trust_remote_code` is the caller's, and not needed here: the config given names no code)."""
        check_layer_count(directory, self.config)
        source: Path | None = directory
        if self.weights is not None:  # transformers takes weights given, or a directory to read, not both
            source, kwargs["state_dict"] = None, self.weights(directory)
        # The class the Auto class maps this config to (its own from_pretrained needs a directory).
        model_class = self.auto_class._model_mapping[type(self.config)]
        model, info = model_class.from_pretrained(
            source, config=self.config, key_mapping=self.key_mapping, output_loading_info=True, **kwargs
        )
        if info["missing_keys"]:
            missing = sorted(info["missing_keys"])
            raise ValueError(
                f"{directory}: the checkpoint lacks {len(missing)} weights of {type(model).__name__}, e.g. {missing[0]}"
            )
        return model


# A weight of layer N: `layer.N.` (BERT, GTE), `layers.N.` (flash-attention BERT, Llama, Mistral).
_LAYER_INDEX = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def check_layer_count(directory: Path, config: PretrainedConfig) -> None:
    """Refuse a config that asks for more layers than the checkpoint's safetensors weights hold (ValueError naming
    num_hidden_layers), before the class is built: building a million layers of a config that says so, to find
    their weights missing, holds the load (and every load after it) for minutes and takes gigabytes. Read from the
    files' headers only; a checkpoint without safetensors files, or without weights named by layer, is left to the
    load itself."""
    layers = getattr(config, "num_hidden_layers", None)
    files = sorted(directory.glob("*.safetensors"))
    if not isinstance(layers, int) or not files:
        return
    indices: set[int] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            names = handle.keys()
            indices.update(int(found.group(1)) for name in names if (found := _LAYER_INDEX.search(name)))
    held = max(indices, default=-1) + 1
    if indices and layers > held:
        raise ValueError(
            f"{directory}: config.json's num_hidden_layers is {layers}, and the checkpoint's weights hold {held} "
            "layers; fix num_hidden_layers"
        )


@dataclass(frozen=True)
class NativeArchitecture:
    """What a shipped model type is natively: transformers' model type, whether its code attends both ways, and how
    its config reads as the native class's settings."""

    model_type: str
    bidirectional: bool
    settings: Callable[[dict[str, Any]], dict[str, Any]] = field(default=_shared_settings)
    weights: Callable[[Path], dict[str, torch.Tensor]] | None = None

    def loader(
        self, raw: dict[str, Any], key_mapping: dict[str, str] | None = None, auto_class: Any = AutoModel
    ) -> NativeLoader:
        """The native class `auto_class` maps to, over the checkpoint's config `raw` (its own type and code left
        out)."""
        config = CONFIG_MAPPING[self.model_type](**self.settings(raw))
        return NativeLoader(config, key_mapping, auto_class, self.weights)


GTE = NativeArchitecture("gte", bidirectional=False, settings=gte_settings)
NATIVE_ARCHITECTURES = {
    "llama_bidirec": NativeArchitecture("llama", bidirectional=True),
    "bidir_mistral": NativeArchitecture("mistral", bidirectional=True),
    "new": GTE,
}
# transformers' own model types that a checkpoint's config also names over code of its own (`auto_map`), in that
# code's settings: served as the native stand-in of that code, never as transformers reads the config itself.
SHIPPED_CODE_UNDER_NATIVE_TYPES = {"gte": GTE}
# Shipped configuration classes (`auto_map`'s AutoConfig) of configs that name no model type.
SHIPPED_CONFIG_CLASSES = {
    "XLMRobertaFlashConfig": NativeArchitecture(
        "xlm-roberta", bidirectional=False, settings=xlm_roberta_flash_settings, weights=xlm_roberta_flash_weights
    ),
}


def native_architecture(config: object) -> NativeArchitecture | None:
    """The native stand-in for a checkpoint's config.json (a dict): by its model type, or by its shipped
    configuration class where it names no model type; None for any other (transformers' own types included, unless
    the config names code of its own over one of SHIPPED_CODE_UNDER_NATIVE_TYPES)."""
    if not isinstance(config, dict):
        return None
    model_type = config.get("model_type")
    if model_type is None:
        return SHIPPED_CONFIG_CLASSES.get(_shipped_config_class(config))
    if not isinstance(model_type, str):
        return None
    if model_type in NATIVE_ARCHITECTURES:
        return NATIVE_ARCHITECTURES[model_type]
    # A config already in transformers' own form (rope_parameters) is read by transformers, whatever code it names.
    shipped_form = "auto_map" in config and "rope_parameters" not in config
    return SHIPPED_CODE_UNDER_NATIVE_TYPES.get(model_type) if shipped_form else None


def _shipped_config_class(config: dict[str, Any]) -> str:
    """The class name of the configuration code `auto_map` names ("" for none)."""
    auto_map = config.get("auto_map")
    name = auto_map.get("AutoConfig") if isinstance(auto_map, dict) else None
    return name.rsplit(".", 1)[-1] if isinstance(name, str) else ""


def serving_class(auto_class: Any, directory: Path, *, trusted: bool) -> Any:
    """What loads the checkpoint in `directory` for a family built on `auto_class`: the native stand-in where its
    config names a shipped model type served natively and the profile does not trust the shipped code, else
    `auto_class` itself. A type whose code attends both ways is the sentence_transformer family's alone (it
    switches the mask); elsewhere it fails the load."""
    if trusted:
        return auto_class
    try:
        raw = read_json(directory / "config.json")
    except ValueError:  # not JSON: transformers' own load says so, naming the file
        return auto_class
    native = native_architecture(raw)
    if native is None or not isinstance(raw, dict):
        return auto_class
    if native.bidirectional:
        raise ValueError(
            f"{directory}: model type {raw['model_type']!r} attends both ways; only the sentence_transformer "
            "adapter serves it natively"
        )
    return native.loader(raw, auto_class=auto_class)
