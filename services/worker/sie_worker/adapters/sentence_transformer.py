"""Dense encoders in the sentence-transformers directory layout.

Reads the directory's own modules.json, pooling config, normalization,
maximum length and prompts, and runs the transformer through `transformers`.
A profile can override them: load_options `pooling` (a mode or list of
modes), `normalize`; run_options `query_prompt`, `document_prompt`,
`instruction_prompt` (with an `{instruction}` placeholder).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

from sie_worker.adapters.base import LoadContext, TextEncoder, TokenizedText

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
# Above this, a tokenizer's model_max_length is a placeholder, not a limit.
_UNSET_MAX_LENGTH = 1_000_000


class SentenceTransformerEncoder(TextEncoder):
    def __init__(self, context: LoadContext) -> None:
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
        self.include_prompt: bool = bool(pooling.get("include_prompt", True))
        self.normalized: bool = bool(load_options.get("normalize", any(m.endswith("Normalize") for m in modules)))

        self.model = AutoModel.from_pretrained(directory, dtype=context.dtype, **_attention(context)).to(context.device).eval()
        self.device = context.device
        hf_tokenizer = AutoTokenizer.from_pretrained(directory)
        st_config = _read_json(directory / "sentence_bert_config.json")
        self.max_sequence_length = _max_length(context.config.max_sequence_length, st_config, hf_tokenizer, self.model)
        self.lowercase = bool(st_config.get("do_lower_case", False))
        self.pad_id = hf_tokenizer.pad_token_id if hf_tokenizer.pad_token_id is not None else 0
        self.special_ids = set(hf_tokenizer.all_special_ids)
        # A private copy of the Rust tokenizer, configured once: encode_batch on it
        # mutates nothing, so the preprocessing threads can share it.
        self.tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_sequence_length, direction=hf_tokenizer.truncation_side)

        hidden = self.model.config.hidden_size
        self.dims = context.config.dims or hidden * len(self.pooling_modes)
        if self.dims != hidden * len(self.pooling_modes):
            raise ValueError(f"config says dims {self.dims}, but the model pools to {hidden * len(self.pooling_modes)}")
        prompts = _read_json(directory / "config_sentence_transformers.json").get("prompts") or {}
        self.query_prompt: str = run_options.get("query_prompt", prompts.get("query", ""))
        document = next((prompts[name] for name in _DOCUMENT_PROMPT_NAMES if name in prompts), "")
        self.document_prompt: str = run_options.get("document_prompt", document)
        self.instruction_prompt: str = run_options.get("instruction_prompt", "{instruction}")
        self._prompt_tokens: dict[str, int] = {}

    def prompt(self, *, is_query: bool, instruction: str | None) -> str:
        if instruction is not None:
            return self.instruction_prompt.replace("{instruction}", instruction)
        return self.query_prompt if is_query else self.document_prompt

    def tokenize(self, texts: Sequence[str], prompt: str) -> list[TokenizedText]:
        inputs = [prompt + text for text in texts]
        if self.lowercase:
            inputs = [text.lower() for text in inputs]
        prompt_tokens = 0 if self.include_prompt or not prompt else self._count_prompt_tokens(prompt)
        return [TokenizedText(encoding.ids, prompt_tokens) for encoding in self.tokenizer.encode_batch(inputs)]

    def _count_prompt_tokens(self, prompt: str) -> int:
        """Tokens of the prompt alone, less a trailing special token (as sentence-transformers counts)."""
        if prompt not in self._prompt_tokens:
            ids = self.tokenizer.encode(prompt.lower() if self.lowercase else prompt).ids
            self._prompt_tokens[prompt] = len(ids) - (1 if ids and ids[-1] in self.special_ids else 0)
        return self._prompt_tokens[prompt]

    def embed(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        longest = max(len(item.ids) for item in batch)
        ids = np.full((len(batch), longest), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(batch), longest), dtype=np.int64)
        pool_mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, item in enumerate(batch):
            ids[row, : len(item.ids)] = item.ids
            mask[row, : len(item.ids)] = 1
            pool_mask[row, item.prompt_tokens : len(item.ids)] = 1
        with torch.inference_mode():
            attention = torch.from_numpy(mask).to(self.device)
            hidden = self.model(input_ids=torch.from_numpy(ids).to(self.device), attention_mask=attention).last_hidden_state
            pooled = pool(hidden, attention, torch.from_numpy(pool_mask).to(self.device), self.pooling_modes)
            if self.normalized:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return pooled.float().cpu().numpy()


def pool(hidden: torch.Tensor, attention: torch.Tensor, pool_mask: torch.Tensor, modes: Sequence[str]) -> torch.Tensor:
    """Pool token vectors [batch, tokens, hidden] into one vector per row; several modes concatenate.

    `attention` marks real tokens; `pool_mask` marks the tokens that count for
    pooling (it differs when prompt tokens are excluded). Padding is on the right.
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
            positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=hidden.dtype).view(1, -1, 1)
            weighted = weights * positions
            vectors.append((hidden * weighted).sum(dim=1) / weighted.sum(dim=1).clamp(min=1e-9))
        elif mode == "lasttoken":
            last = attention.sum(dim=1) - 1
            vectors.append(hidden[torch.arange(hidden.shape[0]), last])
    return torch.cat(vectors, dim=-1)


def _read_modules(directory: Path) -> list[str]:
    """Module types from modules.json; a bare transformers directory means transformer + mean pooling."""
    modules_file = directory / "modules.json"
    if not modules_file.exists():
        return ["Transformer", "Pooling"]
    entries = json.loads(modules_file.read_text())
    types = [entry["type"].rsplit(".", 1)[-1] for entry in entries]
    unsupported = [name for name in types if name not in ("Transformer", "Pooling", "Normalize")]
    if unsupported:
        raise ValueError(f"{modules_file}: module {unsupported[0]!r} is not supported by the sentence_transformer adapter")
    return types


def _pooling_config(directory: Path, modules: list[str]) -> dict[str, Any]:
    """Pooling modes and include_prompt from the Pooling module's config (new or legacy keys)."""
    if "Pooling" not in modules or not (directory / "modules.json").exists():
        return {}
    entries = json.loads((directory / "modules.json").read_text())
    path = next(entry["path"] for entry in entries if entry["type"].endswith("Pooling"))
    raw = _read_json(directory / path / "config.json")
    if "pooling_mode" in raw:
        mode = raw["pooling_mode"]
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    else:
        modes = tuple(mode for key, mode in _LEGACY_POOLING_KEYS.items() if raw.get(key)) or ("mean",)
    return {"modes": modes, "include_prompt": raw.get("include_prompt", True)}


def _max_length(configured: int | None, st_config: dict[str, Any], tokenizer: Any, model: Any) -> int:
    """The model YAML wins, then sentence_bert_config.json, then the tokenizer, then the position table."""
    for candidate in (configured, st_config.get("max_seq_length"), tokenizer.model_max_length):
        if isinstance(candidate, int) and 0 < candidate < _UNSET_MAX_LENGTH:
            return candidate
    return int(model.config.max_position_embeddings)


def _attention(context: LoadContext) -> dict[str, str]:
    backend = context.attention_backend
    if backend == "auto":
        if context.device.type == "cuda" and _flash_attention_installed():
            return {"attn_implementation": "flash_attention_2"}
        return {}
    return {"attn_implementation": backend}


def _flash_attention_installed() -> bool:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}
