"""What turns a model's logits into the scores it answers: a CrossEncoder's saved activation, a softmax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from sie_worker.adapters.layers.checkpoint_files import read_json

ACTIVATIONS = {"sigmoid": torch.sigmoid, "identity": lambda logits: logits, "tanh": torch.tanh}


def saved_activation(directory: Path) -> str:
    """The activation a CrossEncoder saved in the directory (a key of ACTIVATIONS), Sigmoid when it saved none:
    `activation_fn` in config_sentence_transformers.json (sentence-transformers 6) or under config.json's
    `sentence_transformers`, or config.json's `sbert_ce_default_activation_function` (before 4.0; e.g. Identity
    on the ms-marco cross-encoders, Tanh on Qwen3-Reranker seq-cls conversions). A torch activation outside
    ACTIVATIONS fails the load: scoring through another one would be silently wrong."""
    config = read_json(directory / "config.json")
    saved = str(
        read_json(directory / "config_sentence_transformers.json").get("activation_fn")
        or (config.get("sentence_transformers") or {}).get("activation_fn")
        or config.get("sbert_ce_default_activation_function")
        or ""
    )
    name = saved.rsplit(".", 1)[-1].lower()
    if name in ACTIVATIONS:
        return name
    if saved.startswith("torch."):
        raise ValueError(
            f"the saved activation {saved} is not one of {', '.join(ACTIVATIONS)}; set load_options.activation"
        )
    # none saved, or a class of remote code, which sentence-transformers ignores without trust_remote_code
    return "sigmoid"


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by its maximum (no overflow)."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
