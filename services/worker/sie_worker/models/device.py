"""Which device the worker runs on, and in which precision."""

from __future__ import annotations

import torch

_PRECISIONS = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def select_device(requested: str) -> torch.device:
    """`auto` picks CUDA, then MPS, then CPU; an explicit device must exist."""
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"SIE_DEVICE={requested}: CUDA is not available on this machine")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"SIE_DEVICE={requested}: MPS is not available on this machine")
    return device


def compute_dtype(device: torch.device, precision: str) -> torch.dtype:
    """The dtype an accelerator's weights run in; a CPU's is float32 here (its reduced precisions are chosen and
    checked in sie_worker.models.cpu_precision)."""
    if precision not in _PRECISIONS:
        raise ValueError(f"compute precision {precision!r} is not one of {', '.join(_PRECISIONS)}")
    if device.type == "cpu":
        return torch.float32
    return _PRECISIONS[precision]
