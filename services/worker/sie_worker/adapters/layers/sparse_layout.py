"""What a sparse (SPLADE-style) checkpoint directory says about itself: where its masked-LM is, how its logits
become weights, and whether queries skip the model for static per-token weights (OpenSearch doc-only models).

Read from the directory:

- sentence-transformers SparseEncoder: modules.json with a SpladePooling module (`pooling_strategy` max or sum,
  `activation_function` relu or log1p_relu), or a Router whose `router_config.json` sends `query` to a
  SparseStaticEmbedding (its `weight` tensor, or the idf JSON its config names) and `document` to a
  transformer (its own folder, or the root) and SpladePooling;
- OpenSearch as first shipped: the masked-LM at the root and `idf.json` (token -> query weight) next to it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

from sie_worker.adapters.layers.checkpoint_files import module_folder, read_json, read_modules

ACTIVATIONS = ("relu", "log1p_relu")
POOLINGS = ("max", "sum")
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class SparseLayout:
    # The directory of the masked-LM (and its tokenizer) that encodes documents.
    model_directory: Path
    # relu: log(1 + relu(logit)); log1p_relu: log(1 + log(1 + relu(logit))).
    activation: str
    # How token weights combine per vocabulary entry: max or sum over the item's tokens.
    pooling: str
    # Token id -> query weight (tokenizer vocabulary order), or None when queries run the model too.
    idf: np.ndarray | None


def read_layout(directory: Path) -> SparseLayout:
    """The sparse layout of a directory (ValueError for settings this engine does not compute)."""
    entries = read_modules(directory)
    router = next((entry for entry in entries if entry["type"].endswith("Router")), None)
    if router is not None:
        return _router(directory, module_folder(directory, router["path"]))
    pooling = next((entry for entry in entries if entry["type"].endswith("SpladePooling")), None)
    settings = read_json(module_folder(directory, pooling["path"]) / "config.json") if pooling else {}
    idf_file = directory / "idf.json"
    return _layout(directory, settings, _idf_json(idf_file, directory) if idf_file.exists() else None)


def _router(directory: Path, router: Path) -> SparseLayout:
    config = read_json(router / "router_config.json")
    types: dict[str, str] = config.get("types", {})
    structure: dict[str, list[str]] = config.get("structure", {})
    document = structure.get("document") or structure.get("passage") or structure.get("corpus") or []
    model = next((module for module in document if types[module].endswith("Transformer")), None)
    folder = module_folder(router, model) if model else None
    model_directory = folder if folder is not None and (folder / "config.json").exists() else directory
    pooling = next((module for module in document if types[module].endswith("SpladePooling")), None)
    settings = read_json(module_folder(router, pooling) / "config.json") if pooling else {}
    static = next(
        (module for module in structure.get("query", []) if types[module].endswith("SparseStaticEmbedding")), None
    )
    return _layout(
        model_directory, settings, _static_weights(module_folder(router, static), model_directory) if static else None
    )


def _layout(model_directory: Path, settings: dict[str, Any], idf: np.ndarray | None) -> SparseLayout:
    activation = settings.get("activation_function", "relu")
    pooling = settings.get("pooling_strategy", "max")
    if activation not in ACTIVATIONS or pooling not in POOLINGS:
        raise ValueError(
            f"{model_directory}: SpladePooling {activation!r} / {pooling!r} is not supported ({ACTIVATIONS} / "
            f"{POOLINGS})"
        )
    return SparseLayout(model_directory, activation, pooling, idf)


def _static_weights(folder: Path, model_directory: Path) -> np.ndarray:
    """A SparseStaticEmbedding's weights: its saved `weight` tensor, or the idf JSON its config points at."""
    path = read_json(folder / "config.json").get("path")
    if path:
        return _idf_json(model_directory / Path(path).name, model_directory)
    saved = load_file(str(folder / "model.safetensors"))["weight"]
    with np.errstate(over="ignore", invalid="ignore"):
        weights = saved.astype(np.float32)
    if weights.ndim != 1 or not np.isfinite(weights).all():
        raise ValueError(
            f"{folder}: the SparseStaticEmbedding weight must be one finite float32 number per token, not "
            f"{saved.dtype} {saved.shape}"
        )
    return weights


def _idf_json(path: Path, model_directory: Path) -> np.ndarray:
    """token -> weight from JSON, as one weight per token id of the model's tokenizer (unknown tokens: none)."""
    from transformers import AutoTokenizer

    vocabulary = AutoTokenizer.from_pretrained(model_directory).get_vocab()
    weights = np.zeros(max(vocabulary.values()) + 1, dtype=np.float32)
    table = json.loads(path.read_text())
    if not isinstance(table, dict):
        raise ValueError(f"{path}: query weights must be a JSON object of token -> weight, not {type(table).__name__}")
    for token, weight in table.items():
        # NaN, Infinity, null (numpy reads it as NaN) and 1e39 (Infinity as float32) would reach answers as non-numbers.
        if type(weight) not in (int, float) or not abs(weight) <= _FLOAT32_MAX:
            raise ValueError(
                f"{path}: the query weight of {token[:64]!r} is {str(weight)[:64]!r}, not a finite float32 number"
            )
        if token in vocabulary:
            weights[vocabulary[token]] = weight
    return weights
