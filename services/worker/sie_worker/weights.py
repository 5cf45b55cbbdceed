"""Find a model's weights on disk: explicit path, local cache, bundled package, then the Hub."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from huggingface_hub import snapshot_download

from sie_common.model_config import ModelConfig


class WeightsNotFound(RuntimeError):
    """No source had the weights; the message lists what was tried."""


def resolve_weights(config: ModelConfig, *, local_cache: str | None, hf_fallback: bool) -> Path:
    """The directory holding `config`'s weights, trying each source in order."""
    tried: list[str] = []
    if config.path is not None:
        if config.path.is_dir():
            return config.path
        tried.append(f"path {config.path}: not a directory")
    if config.hf_id:
        try:
            return Path(snapshot_download(config.hf_id, revision=config.revision, cache_dir=local_cache, local_files_only=True))
        except Exception as error:  # huggingface_hub raises several types for "not cached"
            tried.append(f"local cache ({local_cache or 'HF_HOME'}): {type(error).__name__}")
    if config.bundled_weights:
        bundled = _bundled_directory(config.bundled_weights)
        if bundled is not None:
            return bundled
        tried.append(f"bundled_weights {config.bundled_weights}: package not installed")
    if config.hf_id and hf_fallback:
        try:
            return Path(snapshot_download(config.hf_id, revision=config.revision, cache_dir=local_cache))
        except Exception as error:
            tried.append(f"Hugging Face Hub: {error}")
    elif config.hf_id:
        tried.append("Hugging Face Hub: disabled (SIE_HF_FALLBACK=false)")
    raise WeightsNotFound(f"no weights found for {config.id}: " + "; ".join(tried))


def _bundled_directory(spec: str) -> Path | None:
    package, _, subdir = spec.partition(":")
    found = importlib.util.find_spec(package)
    if found is None or found.origin is None:
        return None
    directory = Path(found.origin).parent / subdir
    return directory if directory.is_dir() else None
