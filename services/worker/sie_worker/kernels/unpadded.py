"""BERT-family encoders that compute on real tokens only: no matmul sees the padding.

A padded batch of B sequences of up to L tokens runs every Linear layer on
B*L rows, though only the T real tokens count. Everything in a BERT layer
but attention works token by token, so this forward gathers the real tokens
into one [T, hidden] matrix after the embeddings, runs the Linear layers,
residuals and LayerNorms on it, and pads to [B, L] only inside attention.
The arithmetic per real token is the one `transformers` does, so outputs
agree up to float32 rounding; outputs at padded positions come back as zeros,
which is why only adapters that never read them ask for this.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions

# The modules below are BERT-family ones whose layout _is_bert_family checks at run time; torch types a module's
# attributes as `Tensor | Module`, so they are `BertLike` (Any) here.
BertLike = Any


def use_unpadded(model: torch.nn.Module) -> bool:
    """Make `model`'s base encoder skip padded positions; False (model unchanged) where its layers are not
    the BERT-family layout this forward reproduces."""
    base: BertLike = model.base_model
    if not _is_bert_family(base):
        return False
    # An instance attribute, so transformers' heads and peft's wrappers, which call the base model, reach it.
    base.forward = functools.partial(_forward, base, base.forward)
    return True


def _forward(
    base: BertLike,
    padded_forward: Any,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs: Any,
) -> BaseModelOutputWithPoolingAndCrossAttentions:
    """The base model's forward on real tokens; any call this does not cover goes to the padded forward."""
    if (
        input_ids is None
        or attention_mask is None
        or any(value is not None for key, value in kwargs.items() if key != "return_dict")
    ):
        return padded_forward(
            input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, position_ids=position_ids, **kwargs
        )
    batch, length = input_ids.shape
    embedded = base.embeddings(input_ids=input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
    width = embedded.shape[-1]
    real = attention_mask.bool()
    # A batch without padding (one item, or items of one length: a lone query) has nothing to gather or mask.
    positions = None if bool(real.all()) else real.flatten().nonzero().squeeze(1)
    keys = None if positions is None else real[:, None, None, :]
    hidden = embedded.reshape(batch * length, width)
    if positions is not None:
        hidden = hidden.index_select(0, positions)
    for layer in base.encoder.layer:
        attention = layer.attention
        context = _self_attention(attention.self, hidden, batch, length, positions, keys)
        hidden = attention.output(context, hidden)
        hidden = layer.output(layer.intermediate(hidden), hidden)
    if positions is not None:
        hidden = hidden.new_zeros(batch * length, width).index_copy_(0, positions, hidden)
    sequence = hidden.view(batch, length, width)
    pooled = base.pooler(sequence) if getattr(base, "pooler", None) is not None else None
    return BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=sequence, pooler_output=pooled)


def _self_attention(
    module: BertLike,
    hidden: torch.Tensor,
    batch: int,
    length: int,
    positions: torch.Tensor | None,
    keys: torch.Tensor | None,
) -> torch.Tensor:
    """Multi-head self-attention of the real tokens `hidden` [T, width]: padded to [B, heads, L, head size]
    for SDPA, with padded keys masked, and the real rows taken back (`positions` None: no padding, T = B * L)."""
    heads, head_size = module.num_attention_heads, module.attention_head_size

    def by_head(projected: torch.Tensor) -> torch.Tensor:
        if positions is not None:
            projected = projected.new_zeros(batch * length, projected.shape[-1]).index_copy_(0, positions, projected)
        return projected.view(batch, length, heads, head_size).transpose(1, 2)

    context = torch.nn.functional.scaled_dot_product_attention(
        by_head(module.query(hidden)),
        by_head(module.key(hidden)),
        by_head(module.value(hidden)),
        attn_mask=keys,
        scale=module.scaling,
    )
    context = context.transpose(1, 2).reshape(batch * length, heads * head_size)
    return context if positions is None else context.index_select(0, positions)


# transformers' BERT and the models whose layers are copies of BERT's.
_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra"})


def _is_bert_family(base: BertLike) -> bool:
    """BERT's own layout, module for module: embeddings then post-LayerNorm layers of attention.self (query, key,
    value) + attention.output, intermediate, output; absolute positions; no decoder, no cross-attention, and
    nothing between the embeddings and the layers (ELECTRA's embedding projection, for one)."""
    config = base.config
    if (
        config.model_type not in _MODEL_TYPES
        or getattr(config, "is_decoder", False)
        or getattr(config, "add_cross_attention", False)
    ):
        return False
    if getattr(config, "position_embedding_type", "absolute") != "absolute" or config._attn_implementation not in (
        "sdpa",
        "eager",
    ):
        return False
    if not _children(base) <= {"embeddings", "encoder", "pooler"} or _children(getattr(base, "encoder", None)) != {
        "layer"
    }:
        return False
    return len(base.encoder.layer) > 0 and all(_is_bert_layer(layer) for layer in base.encoder.layer)


def _is_bert_layer(layer: BertLike) -> bool:
    if _children(layer) != {"attention", "intermediate", "output"} or _children(layer.attention) != {"self", "output"}:
        return False
    self_attention = layer.attention.self
    return (
        all(isinstance(getattr(self_attention, name, None), torch.nn.Linear) for name in ("query", "key", "value"))
        and hasattr(self_attention, "scaling")
        and getattr(layer, "chunk_size_feed_forward", 0) == 0
    )


def _children(module: torch.nn.Module | None) -> set[str]:
    return {name for name, _ in module.named_children()} if module is not None else set()
