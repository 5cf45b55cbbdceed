"""Process-wide kernel choices per device (sie_worker.models.device.configure_kernels)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from sie_worker.models.device import configure_kernels


@pytest.fixture
def cudnn_attention_restored() -> Iterator[None]:
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_cuda_turns_off_cudnn_attention(cudnn_attention_restored: None) -> None:
    # cuDNN's attention builds a plan per new batch shape: 18x slower on a server's ever-new shapes (H200).
    configure_kernels(torch.device("cuda"))
    assert torch.backends.cuda.cudnn_sdp_enabled() is False


@pytest.mark.parametrize("device", ["cpu", "mps"])
def test_other_devices_keep_pytorch_defaults(device: str, cudnn_attention_restored: None) -> None:
    configure_kernels(torch.device(device))
    assert torch.backends.cuda.cudnn_sdp_enabled() is True
