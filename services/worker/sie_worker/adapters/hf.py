"""What the `transformers`-based families share: the load context and its device, a model loaded in the compute
dtype on that device (eval mode, the attention backend, the CPU kernels the worker's settings ask for), its
tokenizer with the model's length limit, and the prompt put before each text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from sie_worker.adapters.contract import Adapter, LoadContext, Query
from sie_worker.adapters.layers.text_tokenizer import TextTokenizer
from sie_worker.kernels.onednn import use_onednn
from sie_worker.kernels.unpadded import use_unpadded


class HfAdapter(Adapter):
    """A family built on `transformers`. Its prompts: `query_prompt` before a query, `document_prompt` before a
    document, and `instruction_prompt` (with `{instruction}` where it goes) instead of either when the request has an
    instruction."""

    query_prompt: str = ""
    document_prompt: str = ""
    instruction_prompt: str = "{instruction}"

    def __init__(self, context: LoadContext) -> None:
        self.context = context
        self.device = context.device

    def load(self, auto_class: Any, *, reads_padding: bool = True, weights: Path | None = None) -> PreTrainedModel:
        """The model of the directory (`weights`, or the context's) through `auto_class` (load_model)."""
        context = self.context if weights is None else dataclasses.replace(self.context, weights=weights)
        return load_model(auto_class, context, reads_padding=reads_padding)

    def use_tokenizer(
        self,
        model: Any,
        *,
        directory: Path | None = None,
        default_length: int | None = None,
        reserve: int = 0,
        hf: Any = None,
    ) -> TextTokenizer:
        """The model's tokenizer (in `directory`, else the model directory), truncating at the config's
        max_sequence_length (else `default_length`, else what the model's files say) within the model's positions;
        its length becomes the adapter's max_sequence_length. `reserve`: room kept for tokens the adapter inserts;
        `hf`: the tokenizer, loaded already."""
        tokenizer = TextTokenizer(
            directory or self.context.weights,
            self.context.config.max_sequence_length or default_length,
            model,
            reserve=reserve,
            trust_remote_code=self.context.profile.trust_remote_code,
            hf=hf,
        )
        self.max_sequence_length = tokenizer.max_length
        return tokenizer

    def prompt(self, query: Query) -> str:
        """What goes before each text of a part of a request."""
        if query.instruction is not None:
            return self.instruction_prompt.replace("{instruction}", query.instruction)
        return self.query_prompt if query.is_query else self.document_prompt


def load_model(auto_class: Any, context: LoadContext, *, reads_padding: bool = True) -> PreTrainedModel:
    """`auto_class.from_pretrained` on the model directory, in the compute dtype, on the device, in eval mode,
    on oneDNN kernels on a CPU where the context asks for them.
    An adapter that reads no output at padded positions passes reads_padding=False, and a BERT-family
    model on a CPU then computes on real tokens only (sie_worker.kernels.unpadded).
    Code shipped with the weights runs only when the profile sets load_options.trust_remote_code."""
    model = auto_class.from_pretrained(
        context.weights,
        dtype=context.dtype,
        trust_remote_code=context.profile.trust_remote_code,
        **attention_kwargs(context),
    )
    model = model.to(context.device).eval()
    if context.cpu_onednn and context.device.type == "cpu":
        use_onednn(model)
    if not reads_padding and context.cpu_unpadded and context.device.type == "cpu":
        use_unpadded(model)
    return model


def attention_kwargs(context: LoadContext) -> dict[str, str]:
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
