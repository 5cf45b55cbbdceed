"""What the pipeline needs from a model adapter."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from sie_common.model_config import ModelConfig, Profile


@dataclass(frozen=True)
class TokenizedText:
    ids: list[int]
    # Leading tokens that belong to the prompt (excluded from pooling when the model says so).
    prompt_tokens: int = 0


@dataclass(frozen=True)
class LoadContext:
    config: ModelConfig
    profile: Profile
    weights: Path
    device: torch.device
    dtype: torch.dtype
    attention_backend: str


class TextEncoder(Protocol):
    """A model that turns text into dense vectors."""

    dims: int
    max_sequence_length: int
    # True when the model L2-normalizes its output (truncation renormalizes then).
    normalized: bool

    def prompt(self, *, is_query: bool, instruction: str | None) -> str:
        """The prefix put before each text for this kind of request."""

    def tokenize(self, texts: Sequence[str], prompt: str) -> list[TokenizedText]:
        """Token ids, truncated to the model's maximum length. Thread-safe."""

    def embed(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        """Dense float32 vectors, one row per item. Called on the device thread only."""
