"""BERT-family encoders that compute on real tokens only: no matmul sees the padding.

A padded batch of B sequences of up to L tokens runs every Linear layer on
B*L rows, though only the T real tokens count. Everything in a BERT layer
but attention works token by token, so this forward gathers the real tokens
into one [T, hidden] matrix after the embeddings, runs the Linear layers,
residuals and LayerNorms on it, and pads to [B, L] only inside attention.
The arithmetic per real token is the one `transformers` does, so outputs
agree up to float32 rounding; outputs at padded positions come back as zeros,
which is why only adapters that never read them ask for this.

On oneDNN-packed float32 layers (sie_worker.kernels.onednn) two more savings
apply, each computing exactly what the modules do: a layer's query, key and
value run as one matmul on a packed copy of their three weights side by side
(one kernel call instead of three, and one scatter of a padded batch instead
of three), and a layer whose blocks are transformers' own is computed from
their weights without calling each module (some ten module calls a layer: at
a lone query's few tokens, the calls cost about as much as the arithmetic
around the matmuls). A LoRA adapter wraps those Linear layers, and a layer
with a wrapped one runs through its modules, the wrappers included.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions

from sie_worker.kernels.onednn import DenseGelu, PackedLinear, pack, packed_matmul

# The modules below are BERT-family ones whose layout _is_bert_family checks at run time; torch types a module's
# attributes as `Tensor | Module`, so they are `BertLike` (Any) here.
BertLike = Any


def use_unpadded(model: torch.nn.Module) -> bool:
    """Make `model`'s base encoder skip padded positions; False (model unchanged) where its layers are not
    the BERT-family layout this forward reproduces."""
    base: BertLike = model.base_model
    if not _is_bert_family(base):
        return False
    for layer in base.encoder.layer:
        _fuse_query_key_value(layer.attention.self)
    # An instance attribute, so transformers' heads and peft's wrappers, which call the base model, reach it.
    base.forward = functools.partial(_forward, base, base.forward)
    return True


def _fuse_query_key_value(module: BertLike) -> None:
    """Where query, key and value are packed float32 Linears, a packed copy of their weights (and biases) one after
    another, so that one matmul computes all three (`packed_qkv`; a non-persistent buffer: it counts in the model's
    memory, not in its state dict)."""
    projections = (module.query, module.key, module.value)
    if not all(type(linear) is PackedLinear for linear in projections):
        return
    biases = [linear.bias for linear in projections]
    if any(bias is None for bias in biases) and any(bias is not None for bias in biases):
        return
    weight = torch.cat([linear.weight.detach() for linear in projections])
    module.register_buffer("packed_qkv", pack(weight), persistent=False)
    bias = None if biases[0] is None else torch.cat([bias.detach() for bias in biases])
    module.register_buffer("packed_qkv_bias", bias, persistent=False)


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
        if _plain(layer):
            hidden = _add_and_norm(attention.output, context, hidden)
            dense = layer.intermediate.dense
            hidden = _add_and_norm(layer.output, packed_matmul(hidden, dense.packed_weight, dense.bias, "gelu"), hidden)
        else:
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

    def padded(projected: torch.Tensor) -> torch.Tensor:
        if positions is None:
            return projected
        return projected.new_zeros(batch * length, projected.shape[-1]).index_copy_(0, positions, projected)

    def by_head(projected: torch.Tensor) -> torch.Tensor:
        return padded(projected).view(batch, length, heads, head_size).transpose(1, 2)

    if _fused(module):
        together = padded(packed_matmul(hidden, module.packed_qkv, module.packed_qkv_bias))
        query, key, value = together.view(batch, length, 3, heads, head_size).permute(2, 0, 3, 1, 4).unbind(0)
    else:
        query, key, value = by_head(module.query(hidden)), by_head(module.key(hidden)), by_head(module.value(hidden))
    context = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=keys, scale=module.scaling)
    context = context.transpose(1, 2).reshape(batch * length, heads * head_size)
    return context if positions is None else context.index_select(0, positions)


def _fused(module: BertLike) -> bool:
    """Whether the fused query, key and value weights stand for the layer's own: all three are still the packed
    Linears they were copied from (a LoRA adapter wraps them, and its deltas must apply)."""
    return getattr(module, "packed_qkv", None) is not None and all(
        type(linear) is PackedLinear for linear in (module.query, module.key, module.value)
    )


def _plain(layer: BertLike) -> bool:
    """Whether the layer's blocks after attention are transformers' own residual blocks and GELU block on packed
    float32 Linears (no LoRA wrapper), in eval mode (dropout does nothing): computed without their module calls by
    `_add_and_norm`, with the same kernels in the same order."""
    blocks = (layer.attention.output, layer.output)
    return (
        not layer.training
        and type(layer.intermediate) is DenseGelu
        and type(layer.intermediate.dense) is PackedLinear
        and all(
            type(block).__name__ in _RESIDUAL_BLOCKS
            and type(block).__module__.startswith("transformers.models.")
            and type(block.dense) is PackedLinear
            and type(block.LayerNorm) is torch.nn.LayerNorm
            for block in blocks
        )
    )


def _add_and_norm(block: BertLike, hidden: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """A residual block's forward, LayerNorm(dense(hidden) + residual), from its weights (dropout: eval mode)."""
    norm = block.LayerNorm
    projected = packed_matmul(hidden, block.dense.packed_weight, block.dense.bias)
    return torch.nn.functional.layer_norm(projected + residual, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


# transformers' BERT and the models whose layers are copies of BERT's.
_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra"})
# Their residual blocks (dense, dropout, then LayerNorm of the sum with the block's input), whose forward is BERT's.
_RESIDUAL_BLOCKS = frozenset(
    f"{prefix}{block}"
    for prefix in ("Bert", "Roberta", "XLMRoberta", "Camembert", "Electra")
    for block in ("SelfOutput", "Output")
)


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
