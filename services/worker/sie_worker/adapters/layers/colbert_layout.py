"""What a ColBERT checkpoint directory says about itself: projection, markers, lengths, expansion, skiplist.

Three layouts are read:

- Stanford (colbert-ir), unless modules.json lists a Dense module (a later PyLate save of such a checkpoint):
  `config.json` architectures `HF_ColBERT` or an `artifact.metadata`, `linear.weight` next to the encoder
  weights at the root, settings in `artifact.metadata` (query_maxlen, doc_maxlen, attend_to_mask_tokens,
  mask_punctuation, query_token_id / doc_token_id markers).
- PyLate: a `Dense` entry in modules.json, settings as flat keys of `config_sentence_transformers.json`
  (query_prefix, document_prefix, query_length, document_length, do_query_expansion,
  attend_to_expansion_tokens, skiplist_words).
- sentence-transformers `MultiVectorEncoder`: Dense modules, the Transformer's `sentence_bert_config.json`
  (query_length, document_length, query_expansion), a MultiVectorMask module (skiplist_words,
  skiplist_tasks), a Normalize module, and `prompts` put before the text.

Stanford and PyLate insert their markers as token ids right after the first token; a
MultiVectorEncoder prepends its prompts as text. Keys a directory leaves out fall back to PyLate's
defaults ([unused0] / [unused1] markers, queries expanded to 32 tokens, punctuation skipped).
"""

from __future__ import annotations

import pickle
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from sie_worker.adapters.layers.checkpoint_files import module_folder, read_json, read_modules

QUERY_LENGTH = 32
_IDENTITY = ("torch.nn.modules.linear.Identity", "Identity")


@dataclass(frozen=True)
class ColbertLayout:
    # Linear maps applied in order to the encoder's token states (weight [out, in], bias or None).
    projections: tuple[tuple[torch.Tensor, torch.Tensor | None], ...]
    query_prefix: str
    document_prefix: str
    # True: the prefixes are single tokens inserted after the first token; False: text put before the input.
    prefix_tokens: bool
    query_length: int | None
    document_length: int | None
    # Queries padded to query_length with the expansion token ([MASK] when None).
    query_expansion: bool
    expansion_token: str | None
    attend_to_expansion: bool
    skiplist_words: tuple[str, ...]
    skip_in_queries: bool
    normalize: bool


def read_layout(directory: Path) -> ColbertLayout:
    """The layout of a ColBERT directory (ValueError when it has no projection)."""
    entries = read_modules(directory)
    if not any(entry["type"].endswith("Dense") for entry in entries):
        architectures = read_json(directory / "config.json").get("architectures") or []
        if "HF_ColBERT" in architectures or (directory / "artifact.metadata").exists():
            return _stanford(directory)
    settings = read_json(directory / "config_sentence_transformers.json")
    if any(entry["type"].endswith("MultiVectorMask") for entry in entries):
        return _multi_vector_encoder(directory, entries, settings)
    return _pylate(directory, entries, settings)


def _stanford(directory: Path) -> ColbertLayout:
    metadata = read_json(directory / "artifact.metadata")
    return ColbertLayout(
        projections=((_root_projection(directory), None),),
        query_prefix=metadata.get("query_token_id") or "[unused0]",
        document_prefix=metadata.get("doc_token_id") or "[unused1]",
        prefix_tokens=True,
        query_length=metadata.get("query_maxlen") or QUERY_LENGTH,
        document_length=metadata.get("doc_maxlen"),
        query_expansion=True,
        expansion_token=None,
        attend_to_expansion=bool(metadata.get("attend_to_mask_tokens", False)),
        skiplist_words=tuple(string.punctuation) if metadata.get("mask_punctuation", True) else (),
        skip_in_queries=False,
        normalize=True,
    )


def _pylate(directory: Path, entries: list[dict[str, Any]], settings: dict[str, Any]) -> ColbertLayout:
    skiplist = settings.get("skiplist_words")
    return ColbertLayout(
        projections=_dense_modules(directory, entries),
        query_prefix=settings.get("query_prefix", "[unused0]"),
        document_prefix=settings.get("document_prefix", "[unused1]"),
        prefix_tokens=True,
        query_length=settings.get("query_length") or QUERY_LENGTH,
        document_length=settings.get("document_length"),
        query_expansion=settings.get("do_query_expansion", True) is not False,
        expansion_token=None,
        attend_to_expansion=bool(settings.get("attend_to_expansion_tokens", False)),
        skiplist_words=tuple(string.punctuation if skiplist is None else skiplist),
        skip_in_queries=False,
        normalize=True,
    )


def _multi_vector_encoder(directory: Path, entries: list[dict[str, Any]], settings: dict[str, Any]) -> ColbertLayout:
    transformer = _module_config(directory, entries, "Transformer", "sentence_bert_config.json")
    mask = _module_config(directory, entries, "MultiVectorMask", "config.json")
    expansion = transformer.get("query_expansion")
    if expansion and expansion.get("strategy", "fixed") != "fixed":
        raise ValueError(
            f"{directory}: query_expansion strategy {expansion['strategy']!r} is not supported (only 'fixed')"
        )
    tasks = mask.get("skiplist_tasks") or ["document"]
    prompts = settings.get("prompts") or {}
    document_prompt = next((prompts[name] for name in ("document", "passage", "corpus") if prompts.get(name)), "")
    return ColbertLayout(
        projections=_dense_modules(directory, entries),
        query_prefix=prompts.get("query") or "",
        document_prefix=document_prompt,
        prefix_tokens=False,
        query_length=expansion["length"] if expansion else transformer.get("query_length"),
        document_length=transformer.get("document_length"),
        query_expansion=expansion is not None,
        expansion_token=expansion.get("token") if expansion else None,
        attend_to_expansion=bool(expansion and expansion.get("attend", False)),
        skiplist_words=tuple(mask.get("skiplist_words") or ()),
        skip_in_queries="query" in tasks,
        normalize=any(entry["type"].endswith("Normalize") for entry in entries),
    )


def _module_config(directory: Path, entries: list[dict[str, Any]], kind: str, file_name: str) -> dict[str, Any]:
    entry = next((entry for entry in entries if entry["type"].endswith(kind)), None)
    return read_json(module_folder(directory, entry["path"]) / file_name) if entry else {}


def _dense_modules(
    directory: Path, entries: list[dict[str, Any]]
) -> tuple[tuple[torch.Tensor, torch.Tensor | None], ...]:
    """The `linear.weight` (and `linear.bias`) of every Dense module in modules.json, in order."""
    dense = [entry for entry in entries if entry["type"].endswith("Dense")]
    if not dense:
        raise ValueError(f"{directory / 'modules.json'}: no Dense module: a ColBERT model needs its projection")
    projections = []
    for entry in dense:
        folder = module_folder(directory, entry["path"])
        activation = read_json(folder / "config.json").get("activation_function", _IDENTITY[0])
        if activation.rsplit(".", 1)[-1] not in _IDENTITY:
            raise ValueError(f"{folder}: activation {activation!r} is not supported (ColBERT projections are linear)")
        weights = (
            load_file(str(folder / "model.safetensors"))
            if (folder / "model.safetensors").exists()
            else _bin_weights(folder)
        )
        if "linear.weight" not in weights:
            raise ValueError(f"{folder}: the Dense module's weights have no 'linear.weight'")
        projections.append((weights["linear.weight"], weights.get("linear.bias")))
    return tuple(projections)


def _root_projection(directory: Path) -> torch.Tensor:
    """`linear.weight` from the root weights, next to the encoder's (read alone from safetensors)."""
    if (directory / "model.safetensors").exists():
        with safe_open(str(directory / "model.safetensors"), framework="pt") as weights:
            if "linear.weight" in weights.keys():  # noqa: SIM118 - safetensors' safe_open has keys(), no __contains__
                return weights.get_tensor("linear.weight")
    elif "linear.weight" in (weights := _bin_weights(directory)):
        return weights["linear.weight"]
    raise ValueError(f"{directory}: a Stanford ColBERT checkpoint needs 'linear.weight' in its root weights")


def _bin_weights(folder: Path) -> dict[str, torch.Tensor]:
    path = folder / "pytorch_model.bin"
    if not path.exists():
        raise ValueError(f"{folder}: neither model.safetensors nor pytorch_model.bin")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # a pickle that would run code: no retry reads it otherwise
        raise ValueError(f"{path}: not plain tensors (read with weights_only, nothing in it is run): {error}") from None
