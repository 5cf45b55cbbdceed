"""BGE-M3: dense, sparse and multivector embeddings from one forward pass of an XLM-RoBERTa encoder.

Directory (as BAAI/bge-m3 ships): a `transformers` encoder with its tokenizer, plus
`sparse_linear.pt` (state dict of Linear(hidden, 1)) and `colbert_linear.pt`
(state dict of Linear(hidden, colbert dims)) at the root. For the last hidden states H:

- dense: H[CLS], L2-normalized;
- sparse: relu(sparse_linear(H)) per token, the maximum per token id, the cls, eos, pad and
  unk tokens dropped; the vocabulary size is its dims;
- multivector: colbert_linear(H) of every token after CLS (the final </s> included), each L2-normalized.

Only the requested outputs are computed, all from the same hidden states. Score compares a query
(encoded as a query) with each item by `score_mode` (request options, else the profile's run_options):
`dense` (dot product of the normalized vectors, the default), `sparse` (dot product over shared
token ids), `multivector` (MaxSim averaged over the query's vectors) or `hybrid` (their mean weighted
by `score_weights`), as FlagEmbedding's BGEM3FlagModel scores them.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModel

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query, Similarity
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, SparseWeights, TokenizedText
from sie_worker.adapters.layers.padding import model_inputs, padded
from sie_worker.adapters.spec import AdapterSpec, Option

SCORE_MODES = ("dense", "sparse", "multivector", "hybrid")
# The BGE-M3 paper's weights for hybrid scores (dense, sparse, multivector).
DEFAULT_SCORE_WEIGHTS = {"dense": 0.4, "sparse": 0.2, "multivector": 0.4}
# The reference system's name for the multivector score.
_ALIASES = {"colbert": "multivector"}


def _score_mode(value: Any) -> None:
    score_settings({"score_mode": value})


def _score_weights(value: Any) -> None:
    score_settings({"score_weights": value})


class BgeM3Encoder(HfAdapter):
    spec = AdapterSpec(
        "bge_m3",
        tasks=("encode", "score"),
        outputs=("dense", "sparse", "multivector"),
        options=(
            Option("score_mode", f"what a score compares: {', '.join(SCORE_MODES)}", _score_mode, tasks=("score",)),
            Option("score_weights", "a hybrid score's weight of each output", _score_weights, tasks=("score",)),
        ),
    )
    normalized = True

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        directory = context.weights
        self.model = self.load(AutoModel, reads_padding=False)
        self.tokenizer = self.use_tokenizer(self.model)
        hidden = int(self.model.config.hidden_size)
        self.sparse_linear = _linear(directory / "sparse_linear.pt", hidden).to(
            device=context.device, dtype=context.dtype
        )
        self.colbert_linear = _linear(directory / "colbert_linear.pt", hidden).to(
            device=context.device, dtype=context.dtype
        )
        self.multivector_dims = self.colbert_linear.out_features
        if self.sparse_linear.out_features != 1:
            raise ValueError(
                f"{directory / 'sparse_linear.pt'}: a Linear to 1 output, got {self.sparse_linear.out_features}"
            )
        self.dims = context.config.dims or hidden
        if self.dims != hidden:
            raise ValueError(f"config says dims {self.dims}, but the model's CLS vectors have {hidden}")
        self.vocab_size = int(self.model.config.vocab_size)
        hf = self.tokenizer.hf
        dropped = {hf.cls_token_id, hf.eos_token_id, hf.pad_token_id, hf.unk_token_id}
        self.dropped_ids = np.array(sorted(token for token in dropped if token is not None), dtype=np.int64)
        run_options = context.profile.run_options
        self.query_prompt = run_options.get("query_prompt", "")
        self.document_prompt = run_options.get("document_prompt", "")
        self.instruction_prompt = run_options.get("instruction_prompt", "{instruction}")
        self.default_score = score_settings(run_options)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        prompt = self.prompt(query)
        tokenized = self.tokenizer.encode([prompt + (item.text or "") for item in items])
        return [Prepared(item, len(item.ids), self.multivector_rows(item)) for item in tokenized]

    def run(self, batch: Sequence[TokenizedText], query: Query) -> list[EncodedItem]:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        dense = sparse = multivector = None
        hidden = self.model(**model_inputs(self.model, inputs)).last_hidden_state
        if "dense" in query.outputs:
            dense = torch.nn.functional.normalize(hidden[:, 0].float(), p=2, dim=-1).cpu().numpy()
        if "sparse" in query.outputs:
            sparse = torch.relu(self.sparse_linear(hidden)).squeeze(-1).float().cpu().numpy()
        if "multivector" in query.outputs:
            multivector = (
                torch.nn.functional.normalize(self.colbert_linear(hidden[:, 1:]).float(), p=2, dim=-1).cpu().numpy()
            )
        items = []
        for row, item in enumerate(batch):
            length = len(item.ids)
            items.append(
                EncodedItem(
                    dense=None if dense is None else dense[row],
                    sparse=None if sparse is None else self._lexical_weights(item.ids, sparse[row, :length]),
                    multivector=None if multivector is None else multivector[row, : self.multivector_rows(item)],
                )
            )
        return items

    def multivector_rows(self, item: TokenizedText) -> int:
        """Every token after CLS."""
        return max(len(item.ids) - 1, 0)

    def _lexical_weights(self, ids: Sequence[int], weights: np.ndarray) -> SparseWeights:
        """The largest positive weight of each token id, special tokens left out."""
        token_ids = np.asarray(ids, dtype=np.int64)
        keep = (weights > 0) & ~np.isin(token_ids, self.dropped_ids)
        token_ids, weights = token_ids[keep], weights[keep]
        order = np.argsort(token_ids, kind="stable")
        token_ids, weights = token_ids[order], weights[order]
        indices, starts = np.unique(token_ids, return_index=True)
        values = np.maximum.reduceat(weights, starts) if len(starts) else weights
        return SparseWeights(indices.astype(np.uint32), values.astype(np.float32), self.vocab_size)

    def scoring(self, options: Mapping[str, Any]) -> tuple[tuple[str, ...], Similarity]:
        """The outputs a score request encodes and the similarity of the query's to an item's, by the request's
        `score_mode` / `score_weights` options over the profile's. ValueError for options that do not parse."""
        mode, weights = score_settings(options, self.default_score)
        if mode != "hybrid":
            return (mode,), _SIMILARITIES[mode]
        # Only the weights' ratios count: scaled to a largest of 1, their sum cannot overflow (weights of 1e308)
        # nor a weight x score underflow (weights of 5e-324).
        largest = max(weights.values())
        scaled = {output: weight / largest for output, weight in weights.items()}
        used = {output: weight for output, weight in scaled.items() if weight > 0}
        total = sum(used.values())

        def hybrid(query: EncodedItem, item: EncodedItem) -> float:
            return sum(weight * _SIMILARITIES[output](query, item) for output, weight in used.items()) / total

        return tuple(used), hybrid


def score_settings(
    options: Mapping[str, Any], defaults: tuple[str, dict[str, float]] = ("dense", DEFAULT_SCORE_WEIGHTS)
) -> tuple[str, dict[str, float]]:
    """`score_mode` and `score_weights` of a mapping (run_options or request options), over `defaults`."""
    mode = options.get("score_mode", defaults[0])
    mode = _ALIASES.get(mode, mode) if isinstance(mode, str) else mode
    if mode not in SCORE_MODES:
        raise ValueError(f"score_mode must be one of {', '.join(SCORE_MODES)}; got {str(mode)[:64]!r}")
    weights = dict(defaults[1])
    given = options.get("score_weights", {})
    if not isinstance(given, Mapping):
        raise ValueError("score_weights must be a mapping of dense, sparse, multivector to weights")
    named: dict[str, str] = {}
    for key, weight in given.items():
        output = _ALIASES.get(key, key)
        if output not in DEFAULT_SCORE_WEIGHTS:
            raise ValueError(f"score_weights.{str(key)[:64]}: unknown; known: {', '.join(DEFAULT_SCORE_WEIGHTS)}")
        if output in named:  # colbert and multivector: which one won would depend on the order of the map's keys
            raise ValueError(
                f"score_weights.{named[output]} and score_weights.{key} weigh the same output; give one of them"
            )
        named[output] = key
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValueError(f"score_weights.{output}: must be a finite number >= 0, got {str(weight)[:64]}")
        weights[output] = float(weight)
    if mode == "hybrid" and sum(weights.values()) <= 0:
        raise ValueError("score_weights: hybrid scores need a weight above 0")
    return mode, weights


# Each similarity reads an output the score asked the encode for.
def _dense_score(query: EncodedItem, item: EncodedItem) -> float:
    assert query.dense is not None and item.dense is not None
    return float(np.dot(query.dense, item.dense))


def _sparse_score(query: EncodedItem, item: EncodedItem) -> float:
    """Sum of weight products over the token ids both have (indices are ascending and unique)."""
    assert query.sparse is not None and item.sparse is not None
    _, in_query, in_item = np.intersect1d(
        query.sparse.indices, item.sparse.indices, assume_unique=True, return_indices=True
    )
    return float(np.dot(query.sparse.values[in_query].astype(np.float64), item.sparse.values[in_item]))


def _multivector_score(query: EncodedItem, item: EncodedItem) -> float:
    """MaxSim divided by the number of query vectors."""
    assert query.multivector is not None and item.multivector is not None
    if len(query.multivector) == 0 or len(item.multivector) == 0:
        return 0.0
    return float((query.multivector @ item.multivector.T).max(axis=1).mean())


_SIMILARITIES: dict[str, Similarity] = {
    "dense": _dense_score,
    "sparse": _sparse_score,
    "multivector": _multivector_score,
}


def _linear(path: Path, hidden: int) -> torch.nn.Linear:
    """A Linear layer from its saved state dict (`weight` [out, hidden], optional `bias`)."""
    if not path.exists():
        raise ValueError(
            f"{path.name} is missing from {path.parent}: a BGE-M3 model needs sparse_linear.pt and colbert_linear.pt"
        )
    # A file that does not read (truncated, not a torch file, a pickled object weights_only refuses) or does
    # not fit a Linear layer is as permanent a failure as a missing one: ValueError, not a retried load. An OSError
    # (the disk, the network file system) stays what it is.
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, KeyError, pickle.UnpicklingError) as error:
        raise ValueError(f"{path}: not a readable torch state dict: {error}") from None
    weight = state.get("weight") if isinstance(state, Mapping) else None
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[0] < 1 or weight.shape[1] != hidden:
        raise ValueError(
            f"{path}: expected the state dict of a Linear layer from {hidden} inputs (a 'weight' of [out >= 1, "
            f"{hidden}])"
        )
    layer = torch.nn.Linear(hidden, weight.shape[0], bias="bias" in state)
    try:
        layer.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{path}: not the state dict of a Linear layer: {error}") from None
    return layer.eval()
