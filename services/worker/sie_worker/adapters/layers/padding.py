"""Batches of tokenized texts as model inputs: padded to their longest, and on a CPU run as passes of similar
length."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from sie_worker.adapters.items import TokenizedText

Row = TypeVar("Row")
# On a CPU one more forward pass costs about as much as this many padded tokens.
CPU_SPLIT_TOKENS = 64


def padded(
    batch: Sequence[TokenizedText], pad_id: int, device: torch.device, *, left: bool = False
) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and token_type_ids of a batch, padded to its longest item on the right
    (on the left with `left`: each item then ends at the last position)."""
    longest = max(len(item.ids) for item in batch)
    ids = np.full((len(batch), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(batch), longest), dtype=np.int64)
    types = np.zeros((len(batch), longest), dtype=np.int64)
    for row, item in enumerate(batch):
        start = longest - len(item.ids) if left else 0
        ids[row, start : start + len(item.ids)] = item.ids
        mask[row, start : start + len(item.ids)] = 1
        if item.type_ids:
            types[row, start : start + len(item.type_ids)] = item.type_ids
    return {
        "input_ids": torch.from_numpy(ids).to(device),
        "attention_mask": torch.from_numpy(mask).to(device),
        "token_type_ids": torch.from_numpy(types).to(device),
    }


def length_groups(lengths: Sequence[int], split_tokens: int) -> list[list[int]]:
    """Positions of a batch in runs of similar length, shortest first.

    A new run starts where padding the run so far up to the next item's length
    would add more than `split_tokens` padded tokens.
    """
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        if current and len(current) * (lengths[index] - longest) > split_tokens:
            groups.append(current)
            current = []
        current.append(index)
        longest = lengths[index]
    if current:
        groups.append(current)
    return groups


def by_length(
    batch: Sequence[TokenizedText], device: torch.device, forward: Callable[[Sequence[TokenizedText]], Iterable[Row]]
) -> list[Row]:
    """`forward` over the batch, one output per item in the batch's order.

    On a CPU, compute grows with every padded token and a forward pass costs
    little on its own, so the batch runs as several passes of similar length
    (the batch former keeps a batch's oldest item whatever its length: one long
    item would otherwise pad every short one). Accelerators run it whole.
    """
    if device.type != "cpu":
        return list(forward(batch))
    outputs: list[Any] = [None] * len(batch)
    for group in length_groups([len(item.ids) for item in batch], CPU_SPLIT_TOKENS):
        for index, output in zip(group, forward([batch[index] for index in group]), strict=True):
            outputs[index] = output
    return outputs


def model_inputs(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop token_type_ids for models that have no segment embeddings."""
    if getattr(model.config, "type_vocab_size", 0):
        return inputs
    return {key: value for key, value in inputs.items() if key != "token_type_ids"}
