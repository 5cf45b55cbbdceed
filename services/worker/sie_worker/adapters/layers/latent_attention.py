"""NV-Embed's latent-attention pooling (arXiv 2405.17428), built natively from the checkpoint's weights.

Each token's last hidden state attends to a fixed set of trained latent vectors (the token is the query, the
latents are keys and values), then goes through a GEGLU feed-forward block, both with a residual around them and a
LayerNorm before them; the results are averaged over the tokens that pool and L2-normalized. The latents do not
depend on the input, so their keys and values are computed once, at load, and the key/value projection is not kept.

Weights are read from the checkpoint's own layout (`latent_attention_model.` in NV-Embed's safetensors):
`latents`, `cross_attend_blocks.0.{norm,norm_context}.*`, `cross_attend_blocks.0.fn.{to_q,to_kv,to_out}.weight`,
`cross_attend_blocks.1.norm.*`, `cross_attend_blocks.1.fn.net.{0,2}.*`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

# The feed-forward block widens the hidden size this many times (its first Linear twice that: value and gate).
FEED_FORWARD_MULTIPLE = 4
# What NV-Embed's LatentAttentionConfig defaults to for a setting its config.json leaves out.
_DEFAULTS = {
    "num_latents_value": 512,
    "num_cross_heads": 8,
    "hidden_dim": 4096,
    "latent_dim": 4096,
    "cross_dim_head": 4096,
    "output_normalize": True,
}
# Each weight of the layer by its name in the checkpoint (under the prefix).
_CHECKPOINT_KEYS = {
    "latents": "latents",
    "query_norm.weight": "cross_attend_blocks.0.norm.weight",
    "query_norm.bias": "cross_attend_blocks.0.norm.bias",
    "latent_norm.weight": "cross_attend_blocks.0.norm_context.weight",
    "latent_norm.bias": "cross_attend_blocks.0.norm_context.bias",
    "to_q.weight": "cross_attend_blocks.0.fn.to_q.weight",
    "to_kv.weight": "cross_attend_blocks.0.fn.to_kv.weight",
    "to_out.weight": "cross_attend_blocks.0.fn.to_out.weight",
    "feed_forward_norm.weight": "cross_attend_blocks.1.norm.weight",
    "feed_forward_norm.bias": "cross_attend_blocks.1.norm.bias",
    "feed_forward_in.weight": "cross_attend_blocks.1.fn.net.0.weight",
    "feed_forward_in.bias": "cross_attend_blocks.1.fn.net.0.bias",
    "feed_forward_out.weight": "cross_attend_blocks.1.fn.net.2.weight",
    "feed_forward_out.bias": "cross_attend_blocks.1.fn.net.2.bias",
}


@dataclass(frozen=True)
class LatentAttentionShape:
    """The layer's sizes, from NV-Embed's `latent_attention_config`."""

    latents: int
    width: int
    heads: int
    head_width: int
    normalize: bool

    @classmethod
    def from_config(cls, raw: Mapping[str, Any], hidden_size: int) -> LatentAttentionShape:
        """ValueError for sizes that are not positive whole numbers, or widths other than the decoder's (the
        layer's queries are the decoder's hidden states, its latents are normalized at the same width)."""
        settings = {**_DEFAULTS, **raw}
        sizes = {
            name: settings[name]
            for name in ("num_latents_value", "num_cross_heads", "hidden_dim", "latent_dim", "cross_dim_head")
        }
        bad = [
            name for name, value in sizes.items() if isinstance(value, bool) or not isinstance(value, int) or value <= 0
        ]
        if bad:
            raise ValueError(f"latent_attention_config.{bad[0]} must be a positive whole number, got {sizes[bad[0]]!r}")
        if not sizes["hidden_dim"] == sizes["latent_dim"] == hidden_size:
            raise ValueError(
                f"latent_attention_config: hidden_dim {sizes['hidden_dim']} and latent_dim {sizes['latent_dim']} must"
                f" equal the decoder's hidden_size {hidden_size}"
            )
        if not isinstance(settings["output_normalize"], bool):
            raise ValueError("latent_attention_config.output_normalize must be true or false")
        return cls(
            latents=sizes["num_latents_value"],
            width=hidden_size,
            heads=sizes["num_cross_heads"],
            head_width=sizes["cross_dim_head"],
            normalize=settings["output_normalize"],
        )


class LatentAttentionPooling(torch.nn.Module):
    """Token states [batch, tokens, width] and a pooling mask [batch, tokens] -> one vector per row."""

    def __init__(self, shape: LatentAttentionShape) -> None:
        super().__init__()
        inner = shape.heads * shape.head_width
        self.shape = shape
        self.query_norm = torch.nn.LayerNorm(shape.width)
        self.to_q = torch.nn.Linear(shape.width, inner, bias=False)
        self.to_out = torch.nn.Linear(inner, shape.width, bias=False)
        self.feed_forward_norm = torch.nn.LayerNorm(shape.width)
        self.feed_forward_in = torch.nn.Linear(shape.width, shape.width * FEED_FORWARD_MULTIPLE * 2)
        self.feed_forward_out = torch.nn.Linear(shape.width * FEED_FORWARD_MULTIPLE, shape.width)
        # The latents' keys and values per head [heads, latents, head_width], set by `load`.
        self.register_buffer("keys", torch.empty(shape.heads, shape.latents, shape.head_width))
        self.register_buffer("values", torch.empty(shape.heads, shape.latents, shape.head_width))

    def load(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Take the checkpoint's weights (by this module's names); the latents' keys and values are computed here,
        in float32, and the latents and their projection are then dropped."""
        weights = dict(weights)
        latents = weights.pop("latents").float()
        norm = torch.nn.functional.layer_norm(
            latents,
            (self.shape.width,),
            weights.pop("latent_norm.weight").float(),
            weights.pop("latent_norm.bias").float(),
        )
        keys, values = (norm @ weights.pop("to_kv.weight").float().T).chunk(2, dim=-1)
        heads = self.shape.heads
        # Head h owns columns [h * head_width, (h + 1) * head_width) of the projection.
        self.keys = keys.reshape(self.shape.latents, heads, -1).transpose(0, 1).contiguous()
        self.values = values.reshape(self.shape.latents, heads, -1).transpose(0, 1).contiguous()
        self.load_state_dict(weights, strict=False, assign=True)

    def forward(self, hidden: torch.Tensor, pool_mask: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = hidden.shape
        queries = self.to_q(self.query_norm(hidden))
        queries = queries.reshape(batch, tokens, self.shape.heads, -1).transpose(1, 2)
        keys = self.keys.to(queries.dtype).unsqueeze(0).expand(batch, -1, -1, -1)
        values = self.values.to(queries.dtype).unsqueeze(0).expand(batch, -1, -1, -1)
        attended = torch.nn.functional.scaled_dot_product_attention(queries, keys, values)
        hidden = self.to_out(attended.transpose(1, 2).reshape(batch, tokens, -1)) + hidden
        value, gate = self.feed_forward_in(self.feed_forward_norm(hidden)).chunk(2, dim=-1)
        hidden = self.feed_forward_out(value * torch.nn.functional.gelu(gate)) + hidden
        # Summed in float32, as the reference does: a long text's sum overflows float16.
        pooled = (hidden.float() * pool_mask.unsqueeze(-1).float()).sum(dim=1) / pool_mask.sum(
            dim=1, keepdim=True
        ).float()
        return torch.nn.functional.normalize(pooled, p=2, dim=-1) if self.shape.normalize else pooled


def checkpoint_tensors(directory: Path, prefix: str) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's safetensors checkpoint (`model.safetensors`, or the shards its
    `model.safetensors.index.json` names) whose key starts with `prefix`, by the key without it. Only the shards
    holding such keys are opened, and of them only those tensors are read."""
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map")
        files = sorted({name for key, name in weight_map.items() if key.startswith(prefix)})
    else:
        files = ["model.safetensors"]
    found: dict[str, torch.Tensor] = {}
    for name in files:
        path = directory / name
        if path.name != name or not path.is_file():
            raise OSError(f"{directory}: checkpoint file {name!r} is missing or lies outside the model directory")
        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                if key.startswith(prefix):
                    found[key[len(prefix) :]] = handle.get_tensor(key)
    return found


def load_latent_attention(
    directory: Path, prefix: str, shape: LatentAttentionShape, device: torch.device, dtype: torch.dtype
) -> LatentAttentionPooling:
    """The layer with the checkpoint's weights under `prefix`; ValueError for a missing, extra or misshapen weight."""
    stored = checkpoint_tensors(directory, prefix)
    by_checkpoint_key = {key: name for name, key in _CHECKPOINT_KEYS.items()}
    unknown = sorted(set(stored) - set(by_checkpoint_key))
    missing = sorted(set(by_checkpoint_key) - set(stored))
    if unknown or missing:
        raise ValueError(
            f"{directory}: latent attention weights under {prefix!r}: "
            + "; ".join(
                part
                for part in (f"missing {missing}" if missing else "", f"unexpected {unknown}" if unknown else "")
                if part
            )
        )
    with torch.device("meta"):
        layer = LatentAttentionPooling(shape)
    inner = shape.heads * shape.head_width
    expected = {
        "latents": (shape.latents, shape.width),
        "latent_norm.weight": (shape.width,),
        "latent_norm.bias": (shape.width,),
        "to_kv.weight": (2 * inner, shape.width),
        **{name: tuple(parameter.shape) for name, parameter in layer.named_parameters()},
    }
    weights = {by_checkpoint_key[key]: tensor for key, tensor in stored.items()}
    wrong = [name for name, tensor in weights.items() if tuple(tensor.shape) != expected[name]]
    if wrong:
        name = wrong[0]
        raise ValueError(
            f"{directory}: latent attention weight {_CHECKPOINT_KEYS[name]} is {tuple(weights[name].shape)}, "
            f"the config makes it {expected[name]}"
        )
    layer.load(weights)
    return layer.to(device=device, dtype=dtype).eval().requires_grad_(False)
