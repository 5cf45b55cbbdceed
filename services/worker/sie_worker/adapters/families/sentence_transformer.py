"""Dense encoders in the sentence-transformers directory layout.

Reads the directory's own modules.json, pooling config, Dense modules,
normalization, maximum length and prompts, and runs the transformer through
`transformers`. A profile can override them: load_options `pooling` (a mode
or list of modes), `include_prompt`, `normalize`, `padding_side`, `bidirectional` (decoders
trained with bidirectional attention); run_options `query_prompt`,
`document_prompt`, `instruction_prompt` (with an `{instruction}` placeholder). A checkpoint whose model type is its
own code's over a transformers architecture (sie_worker.adapters.layers.native_architectures: llama-embed-nemotron's
`llama_bidirec`, new-impl's GTE `new`) loads through that architecture's class, bidirectional where its code is, unless
the profile trusts the shipped code.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModel

from sie_worker.adapters.contract import AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, TokenizedText
from sie_worker.adapters.layers.checkpoint_files import module_folder, read_json, read_modules
from sie_worker.adapters.layers.dense_modules import DenseModule, load_dense
from sie_worker.adapters.layers.native_architectures import native_architecture
from sie_worker.adapters.layers.padding import by_length, padded
from sie_worker.adapters.layers.text_tokenizer import position_offset
from sie_worker.adapters.spec import AdapterSpec
from sie_worker.kernels.bidirectional import use_bidirectional

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# Older sentence-transformers configs: one boolean per mode, in this order.
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
PADDING_SIDES = ("left", "right")
# Prompt token counts (for include_prompt: false) kept per model, most recently used first.
PROMPT_COUNTS_KEPT = 16
# transformers' own encoders whose forward skips a pooler layer set to None (remote code and other layouts may not).
_POOLER_OPTIONAL = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "mpnet"})


class SentenceTransformerEncoder(HfAdapter):
    spec = AdapterSpec("sentence_transformer", tasks=("encode",), outputs=("dense",))

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        directory = context.weights
        load_options = dict(context.profile.load_options)
        run_options = dict(context.profile.run_options)
        modules = _read_modules(directory)

        pooling = _pooling_config(directory, modules)
        modes = load_options.get("pooling", pooling.get("modes", ("mean",)))
        self.pooling_modes: tuple[str, ...] = (modes,) if isinstance(modes, str) else tuple(modes)
        unknown = [mode for mode in self.pooling_modes if mode not in POOLING_MODES]
        if unknown:
            raise ValueError(f"unknown pooling mode {unknown[0]!r}; known: {', '.join(POOLING_MODES)}")
        self.include_prompt: bool = _flag(load_options, "include_prompt", bool(pooling.get("include_prompt", True)))
        self.normalized = bool(load_options.get("normalize", any(m.endswith("Normalize") for m in modules)))
        model_config = read_json(directory / "config.json")
        # A model type whose code only takes the causal mask away: bidirectional whoever's code builds it (the shipped
        # code's own mask override may be one transformers no longer calls).
        native = native_architecture(model_config)
        bidirectional = _flag(load_options, "bidirectional", native is not None and native.bidirectional)
        if native is not None and native.bidirectional and not bidirectional:
            raise ValueError(
                f"load option bidirectional: false, but model type {model_config['model_type']!r} attends both ways"
            )
        trusted = context.profile.trust_remote_code
        self.model = self.load(
            native.loader(model_config) if native and not trusted else AutoModel, reads_padding=False
        )
        if getattr(self.model.config, "use_cache", None):
            self.model.config.use_cache = False  # one forward pass per batch: a key/value cache is only memory
        if pooler_skippable(self.model):
            # Pooling reads the last hidden state: BERT's pooler layer would be a pass for nothing.
            self.model.register_module("pooler", None)
        self.tokenizer = self.use_tokenizer(self.model)
        padding_side = load_options.get("padding_side", self.tokenizer.hf.padding_side)
        if padding_side not in PADDING_SIDES:
            raise ValueError(
                f"load option padding_side must be one of {', '.join(PADDING_SIDES)}, got {padding_side!r}"
            )
        self.pad_left: bool = padding_side == "left"
        # Left-padded items get their positions counted from their first real token, as right-padded ones do
        # (from the model's own first position: RoBERTa-style tables start past their padding row).
        self._takes_positions = "position_ids" in inspect.signature(self.model.forward).parameters
        self._first_position = position_offset(self.model)
        if bidirectional:
            use_bidirectional(self.model, self._hidden, self.device)

        width = self.model.config.hidden_size * len(self.pooling_modes)
        self.dense: list[DenseModule] = []
        for path in _dense_paths(directory, modules):
            self.dense.append(load_dense(directory, path, width, self.device))
            width = self.dense[-1].out_features
        self.dims = context.config.dims or width
        if self.dims != width:
            raise ValueError(f"config says dims {self.dims}, but the model gives {width}")
        prompts = read_json(directory / "config_sentence_transformers.json").get("prompts") or {}
        self.query_prompt = run_options.get("query_prompt", prompts.get("query", ""))
        document = next((prompts[name] for name in _DOCUMENT_PROMPT_NAMES if name in prompts), "")
        self.document_prompt = run_options.get("document_prompt", document)
        self.instruction_prompt = run_options.get("instruction_prompt", "{instruction}")
        # Each request's instruction makes a prompt of its own: only the latest few counts are kept.
        self._count_prompt_tokens = functools.lru_cache(maxsize=PROMPT_COUNTS_KEPT)(self._prompt_token_count)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        tokenized = self.tokenize([item.text or "" for item in items], self.prompt(query))
        return [Prepared(item, len(item.ids)) for item in tokenized]

    def tokenize(self, texts: Sequence[str], prompt: str) -> list[TokenizedText]:
        """Each text after the prompt, with the prompt's tokens counted where pooling leaves them out."""
        prompt_tokens = 0
        if prompt and not self.include_prompt:
            # A prompt left out of pooling that fills the model's length leaves nothing to pool: every item
            # would get a zero vector.
            prompt_tokens, length = self._count_prompt_tokens(prompt)
            if length >= self.max_sequence_length:
                raise AdapterError(
                    f"the prompt (with the instruction in it) is {length} tokens or more, and the model reads "
                    f"{self.max_sequence_length}"
                    " and leaves the prompt out of pooling: no token of the texts would be pooled",
                    reason="PROMPT_TOO_LONG",
                    metadata={"limit": str(self.max_sequence_length)},
                )
        tokenized = [
            TokenizedText(item.ids, prompt_tokens) for item in self.tokenizer.encode([prompt + text for text in texts])
        ]
        # A decoder's tokenizer may add no special token: an empty text is then no tokens, which pooled to a zero
        # vector beside other items and failed a forward pass of its own.
        empty = next((index for index, item in enumerate(tokenized) if not item.ids), None)
        if empty is not None:
            raise AdapterError(
                f"item {empty}: the text is no tokens for this model (its tokenizer adds none of its own); an empty "
                f"text has no embedding",
                reason="NO_TOKENS",
                metadata={"item": str(empty)},
            )
        return tokenized

    def _prompt_token_count(self, prompt: str) -> tuple[int, int]:
        """Tokens of the prompt alone, less a trailing special token (as sentence-transformers counts), and all
        of them (at most the model's length)."""
        ids = self.tokenizer.encode([prompt])[0].ids
        return len(ids) - (1 if ids and ids[-1] in self.tokenizer.special_ids else 0), len(ids)

    def run(self, batch: Sequence[TokenizedText], query: Query) -> list[EncodedItem]:
        return [EncodedItem(dense=row) for row in by_length(batch, self.device, self.embed)]

    def embed(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        """Dense float32 vectors, one row per item, from one forward pass."""
        inputs = padded(batch, self.tokenizer.pad_id, self.device, left=self.pad_left)
        longest = inputs["input_ids"].shape[1]
        pool_mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, item in enumerate(batch):
            start = longest - len(item.ids) if self.pad_left else 0
            pool_mask[row, start + item.prompt_tokens : start + len(item.ids)] = 1
        attention = inputs["attention_mask"]
        hidden = self._hidden(inputs["input_ids"], attention)
        pooled = pool(hidden, attention, torch.from_numpy(pool_mask).to(self.device), self.pooling_modes)
        for dense in self.dense:
            pooled = dense(pooled)
        if self.normalized:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()

    def _hidden(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        """The transformer's last hidden state [batch, tokens, hidden]."""
        extra = {}
        if self.pad_left and self._takes_positions:
            extra["position_ids"] = (attention.cumsum(dim=1) - 1).clamp(min=0) + self._first_position
        return self.model(input_ids=input_ids, attention_mask=attention, **extra).last_hidden_state


def pooler_skippable(model: torch.nn.Module) -> bool:
    """Whether `model` has a pooler layer that may be set to None: transformers' own class of an architecture whose
    forward then skips it (remote code may call it regardless)."""
    return (
        type(model).__module__.startswith("transformers.models.")
        and getattr(getattr(model, "config", None), "model_type", None) in _POOLER_OPTIONAL
        and isinstance(getattr(model, "pooler", None), torch.nn.Module)
    )


def pool(hidden: torch.Tensor, attention: torch.Tensor, pool_mask: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """Pool token vectors [batch, tokens, hidden] into one vector per row; several modes concatenate.

    `attention` marks real tokens; `pool_mask` marks the tokens that count for
    pooling (it differs when prompt tokens are excluded). Padding may be on
    either side: the last token is the last real one, weights count from the first.
    """
    hidden = hidden.float()
    weights = pool_mask.unsqueeze(-1).float()
    counts = weights.sum(dim=1).clamp(min=1e-9)
    vectors = []
    for mode in modes:
        if mode == "cls":
            first = pool_mask.argmax(dim=1)
            vectors.append(hidden[torch.arange(hidden.shape[0]), first])
        elif mode == "max":
            vectors.append(hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values)
        elif mode == "mean":
            vectors.append((hidden * weights).sum(dim=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            vectors.append((hidden * weights).sum(dim=1) / counts.sqrt())
        elif mode == "weightedmean":
            positions = attention.cumsum(dim=1).to(hidden.dtype).unsqueeze(-1)
            weighted = weights * positions
            vectors.append((hidden * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = attention.shape[1] - 1 - attention.flip(1).argmax(dim=1)
            vectors.append(hidden[torch.arange(hidden.shape[0]), last])
    return torch.cat(vectors, dim=-1)


def _flag(options: dict[str, Any], name: str, default: bool) -> bool:
    value = options.get(name, default)
    if not isinstance(value, bool):
        raise ValueError(f"load option {name} must be true or false, got {value!r}")
    return value


def _read_modules(directory: Path) -> list[str]:
    """Module types from modules.json; a bare transformers directory means transformer + mean pooling.

    Dense modules (sentence-transformers' own) go after Pooling and before Normalize."""
    modules_file = directory / "modules.json"
    if not modules_file.exists():
        return ["Transformer", "Pooling"]
    types = [_module_type(entry["type"]) for entry in read_modules(directory)]
    unsupported = [name for name in types if name not in ("Transformer", "Pooling", "Dense", "Normalize")]
    if unsupported:
        raise ValueError(
            f"{modules_file}: module {unsupported[0]!r} is not supported by the sentence_transformer adapter"
        )
    dense = [index for index, name in enumerate(types) if name == "Dense"]
    if dense and (
        "Pooling" not in types
        or dense[0] < types.index("Pooling")
        or ("Normalize" in types and dense[-1] > types.index("Normalize"))
    ):
        raise ValueError(f"{modules_file}: Dense modules must come after Pooling and before Normalize")
    return types


def _module_type(name: str) -> str:
    """The class name of a module type; a Dense from another library (PyLate's works per token) keeps its full name."""
    short = name.rsplit(".", 1)[-1]
    return short if short != "Dense" or name.startswith("sentence_transformers.") else name


def _dense_paths(directory: Path, modules: list[str]) -> list[str]:
    if "Dense" not in modules:
        return []
    return [entry["path"] for entry in read_modules(directory) if _module_type(entry["type"]) == "Dense"]


def _pooling_config(directory: Path, modules: list[str]) -> dict[str, Any]:
    """Pooling modes and include_prompt from the Pooling module's config (new or legacy keys)."""
    if "Pooling" not in modules or not (directory / "modules.json").exists():
        return {}
    path = next(entry["path"] for entry in read_modules(directory) if entry["type"].endswith("Pooling"))
    raw = read_json(module_folder(directory, path) / "config.json")
    if "pooling_mode" in raw:
        mode = raw["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(mode for key, mode in _LEGACY_POOLING_KEYS.items() if raw.get(key)) or ("mean",)
    return {"modes": modes, "include_prompt": raw.get("include_prompt", True)}
