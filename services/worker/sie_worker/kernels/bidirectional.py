"""Decoders run with bidirectional attention, for embedders trained that way (GritLM, gte-Qwen2).

Such a model loads as an ordinary causal decoder, and run causally it gives
wrong vectors without any error. transformers builds a decoder's masks in
`create_causal_mask` / `create_sliding_window_causal_mask`, which give a
padding-only (bidirectional) mask when the config says `is_causal: false`;
the kernels take causality from each attention module's `is_causal` when
they get no mask (SDPA on a batch without padding, flash attention). Both are
switched off, then a probe checks that the first token now sees the last one,
with and without padding: a model whose code builds its masks some other way
is refused rather than run causally.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

# Forward pass of a model: (input_ids, attention_mask) -> last hidden state [batch, tokens, hidden].
Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# Two sequences that differ only in their last token (ids kept within any vocabulary of 16+ entries).
_PROBE = ((5, 6, 7, 8), (5, 6, 7, 9))


def use_bidirectional(model: PreTrainedModel, forward: Forward, device: torch.device) -> None:
    """Make `model` attend in both directions; ValueError when the probe still finds it causal."""
    model.config.is_causal = False
    for module in model.modules():
        if isinstance(getattr(module, "is_causal", None), bool):
            # torch types Module.__setattr__ for tensors and modules
            module.is_causal = False  # type: ignore[assignment]
    problems = [
        case for case, pad in (("without padding", 0), ("with padding", 1)) if not _attends_ahead(forward, device, pad)
    ]
    if problems:
        raise ValueError(
            f"load option bidirectional: the {type(model).__name__} ({model.config.model_type}) still attends "
            f"causally {' and '.join(problems)}"
            " after is_causal was switched off; this architecture builds its attention mask in a way the worker "
            "cannot change"
        )


def _attends_ahead(forward: Forward, device: torch.device, pad: int) -> bool:
    """Whether the first token's output depends on the last real token, on a batch with `pad` padded positions."""
    ids = torch.tensor([[*row, *([0] * pad)] for row in _PROBE], dtype=torch.long, device=device)
    mask = torch.tensor([[1] * len(row) + [0] * pad for row in _PROBE], dtype=torch.long, device=device)
    with torch.inference_mode():
        first = forward(ids, mask)[:, 0].float()
    scale = first.abs().max().clamp(min=1e-12)
    return bool(((first[0] - first[1]).abs().max() / scale) > 1e-3)
