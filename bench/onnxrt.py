"""ONNX Runtime as a peer, in-process: the same model exported with torch.onnx, run at ONNX Runtime's best CPU settings.

The model (a BERT-family encoder with mean pooling and normalization, as
all-MiniLM-L6-v2) is exported with torch.onnx's dynamo exporter, dynamic batch
and sequence axes, and run by an InferenceSession with every graph
optimization, sequential execution and the worker's thread count. The
transformer optimizer of onnxruntime.transformers (BERT fusions) is tried too,
and each graph with idle threads spinning and not; the fastest is timed. Texts are sorted and batched as
sentence-transformers does; pooling and normalization run in numpy.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch
from transformers import AutoModel, AutoTokenizer

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MIN_COSINE = 0.9999


class _Hidden(torch.nn.Module):
    """The encoder with positional inputs and its last hidden state as the one output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).last_hidden_state


def export(model_dir: Path, out: Path) -> Path:
    """`model_dir`'s encoder as ONNX at `out` (one file), batch and sequence dynamic."""
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    # Two texts of different lengths: torch.export specializes sizes 0 and 1.
    example = tokenizer(["an example sentence to export", "a second one"], padding=True, return_tensors="pt")
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    with contextlib.redirect_stdout(None):  # the exporter prints its steps
        torch.onnx.export(
            _Hidden(model).eval(),
            tuple(example[name] for name in INPUTS),
            str(out),
            dynamo=True,
            external_data=False,
            input_names=list(INPUTS),
            output_names=["last_hidden_state"],
            dynamic_shapes={name: {0: batch, 1: sequence} for name in INPUTS},
        )
    return out


def optimize_for_bert(exported: Path, model_dir: Path, out: Path) -> dict[str, Any]:
    """onnxruntime.transformers' BERT fusions on `exported`, saved at `out`: the fused operators it made."""
    from onnxruntime.transformers import optimizer
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    optimized = optimizer.optimize_model(
        str(exported),
        model_type="bert",
        num_heads=config.num_attention_heads,
        hidden_size=config.hidden_size,
        opt_level=0,
    )
    optimized.save_model_to_file(str(out))
    return {name: count for name, count in optimized.get_fused_operator_statistics().items() if count}


def session(path: Path, threads: int, spinning: bool = True) -> onnxruntime.InferenceSession:
    """ONNX Runtime's best CPU settings: every graph optimization, `threads` intra-op threads, sequential; `spinning`
    lets idle intra-op threads spin for work (ONNX Runtime's default), a cost where other processes share the cores."""
    options = onnxruntime.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class Encoder:
    """Mean-pooled, normalized embeddings from an ONNX session, batched as sentence-transformers batches."""

    def __init__(self, model_dir: Path, onnx_session: onnxruntime.InferenceSession, max_length: int) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.session = onnx_session
        self.max_length = max_length

    def encode(self, texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """Longest texts first, `batch_size` a pass, each pass padded to its longest (as SentenceTransformer.encode)."""
        order = np.argsort([-len(text) for text in texts], kind="stable")
        vectors: list[np.ndarray] = []
        for start in range(0, len(texts), batch_size):
            batch = [texts[index] for index in order[start : start + batch_size]]
            encoded = self.tokenizer(
                batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="np"
            )
            hidden = self.session.run(None, {name: encoded[name].astype(np.int64) for name in INPUTS})[0]
            mask = encoded["attention_mask"][..., None].astype(np.float32)
            pooled = (hidden * mask).sum(axis=1) / np.clip(mask.sum(axis=1), 1e-9, None)
            vectors.append(pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None))
        stacked = np.concatenate(vectors) if vectors else np.zeros((0, 0), dtype=np.float32)
        return stacked[np.argsort(order)]

    def rate(self, texts: Sequence[str], batch_size: int) -> float:
        started = time.perf_counter()
        self.encode(texts, batch_size)
        return len(texts) / (time.perf_counter() - started)


def min_cosine(vectors: np.ndarray, reference: np.ndarray) -> float:
    """The smallest cosine between matching rows (both sides normalized here)."""
    a = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return float((a * b).sum(axis=1).min())


class OnnxRuntimePeer:
    """The exported model (and its BERT-optimized variant) ready to time, checked against a reference first."""

    def __init__(self, model_dir: Path, scratch: Path, threads: int, max_length: int) -> None:
        self.model_dir = model_dir
        self.threads = threads
        self.max_length = max_length
        started = time.perf_counter()
        exported = export(model_dir, scratch / "model.onnx")
        self.notes: dict[str, Any] = {
            "export": "torch.onnx.export(dynamo=True), dynamic batch and sequence axes",
            "export_s": round(time.perf_counter() - started, 1),
            "intra_op_threads": threads,
        }
        self.graphs: dict[str, Path] = {"exported graph": exported}
        try:
            self.notes["bert_fusions"] = optimize_for_bert(exported, model_dir, scratch / "model-bert.onnx")
            self.graphs["transformers optimizer (bert)"] = scratch / "model-bert.onnx"
        except Exception as error:
            logging.exception("onnxruntime.transformers optimizer failed")
            self.notes["bert_fusions"] = f"failed: {error}"
        self.encoder = self._encoder(next(iter(self.graphs.values())))

    def _encoder(self, path: Path) -> Encoder:
        return Encoder(self.model_dir, session(path, self.threads), self.max_length)

    def check(self, texts: Sequence[str], reference: np.ndarray) -> None:
        """Every graph's vectors against `reference`'s (the same texts); raises below MIN_COSINE."""
        cosines = {name: min_cosine(self._encoder(path).encode(texts), reference) for name, path in self.graphs.items()}
        self.notes["min_cosine_vs_sentence_transformers"] = cosines
        bad = {name: value for name, value in cosines.items() if value < MIN_COSINE}
        if bad:
            raise RuntimeError(
                f"ONNX Runtime's vectors drift from sentence-transformers' (min cosine {bad}, need >= {MIN_COSINE})"
            )

    def choose_graph(self, texts: Sequence[str], batch_size: int) -> str:
        """The fastest float32 graph and spinning setting, one pass each (after a warm-up); the one timed from now
        on."""
        best, self.encoder, rates = self._fastest(self.graphs, texts, batch_size)
        self.notes["graphs_tried_items_per_s"] = rates
        self.notes["graph"] = best
        return best

    def int8(self, texts: Sequence[str], batch_size: int) -> tuple[str, Encoder]:
        """ONNX Runtime's int8 path: each float32 graph through `quantize_dynamic` (int8 weights, activations
        quantised per batch, as the worker's int8), the fastest one and its encoder."""
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantized: dict[str, Path] = {}
        for graph, path in self.graphs.items():
            out = path.with_name(f"{path.stem}-int8.onnx")
            with contextlib.redirect_stdout(None):
                quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
            quantized[f"{graph}, quantize_dynamic int8"] = out
        best, encoder, rates = self._fastest(quantized, texts, batch_size)
        self.notes["int8"] = {"quantization": "onnxruntime.quantization.quantize_dynamic, QInt8 weights", "graphs_tried_items_per_s": rates, "graph": best}
        return best, encoder

    def _fastest(self, graphs: dict[str, Path], texts: Sequence[str], batch_size: int) -> tuple[str, Encoder, dict[str, float]]:
        rates: dict[str, float] = {}
        encoders: dict[str, Encoder] = {}
        for graph, path in graphs.items():
            for spinning in (True, False):
                name = f"{graph}, threads {'spinning' if spinning else 'not spinning'}"
                encoders[name] = Encoder(self.model_dir, session(path, self.threads, spinning), self.max_length)
                encoders[name].encode(texts[:128], batch_size)
                rates[name] = encoders[name].rate(texts, batch_size)
        best = max(rates, key=rates.__getitem__)
        return best, encoders[best], rates

    def send(self, texts: Sequence[str]) -> int:
        return len(self.encoder.encode(texts))
