"""Loading a `transformers` model the way every adapter does: its compute dtype, its device, eval mode, the attention
backend, and the CPU kernels the worker's settings ask for."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedModel

from sie_worker.adapters.base import LoadContext
from sie_worker.kernels.onednn import use_onednn
from sie_worker.kernels.unpadded import use_unpadded


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
