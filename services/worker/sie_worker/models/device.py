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


def configure_kernels(device: torch.device) -> None:
    """Process-wide kernel choices for the device the worker serves on.

    On CUDA, cuDNN's attention is turned off: it builds an execution plan for
    each (batch size, length) it has not seen, and a server's batches rarely
    repeat one (their sizes and the texts' lengths vary). On an H200, 40
    batches of new shapes ran at 321 items/s with it and 5,751 without it
    (docs/benchmarks.md, GPU); PyTorch then picks its flash or
    memory-efficient attention, which need no plan."""
    if device.type == "cuda":
        torch.backends.cuda.enable_cudnn_sdp(False)


def compute_dtype(device: torch.device, precision: str) -> torch.dtype:
    """The dtype an accelerator's weights run in; a CPU's is float32 here (its reduced precisions are chosen and
    checked in sie_worker.models.cpu_precision)."""
    if precision not in _PRECISIONS:
        raise ValueError(f"compute precision {precision!r} is not one of {', '.join(_PRECISIONS)}")
    if device.type == "cpu":
        return torch.float32
    return _PRECISIONS[precision]
