"""A batch that fails is retried in halves: out of device memory until RESOURCE_EXHAUSTED on one item, and on any
other error until the failing item is alone, so the others still get their outputs."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from sie_common.edge.errors import InvalidArgument, ResourceExhausted
from sie_worker.models.batch_retry import run_isolating_failures
from sie_worker.models.memory import is_cuda_oom


def embed_fitting(limit: int, calls: list[int]):
    """A forward pass that runs out of CUDA memory on more than `limit` items."""

    def embed(items):
        calls.append(len(items))
        if len(items) > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return np.array([[float(item), float(item) * 2] for item in items], dtype=np.float32)

    return embed


def test_an_oom_batch_is_split_in_halves_and_keeps_item_order() -> None:
    calls: list[int] = []
    recovered: list[bool] = []
    items = list(range(7))
    result = run_isolating_failures(embed_fitting(2, calls), items, is_oom=is_cuda_oom, recover=lambda: recovered.append(True))
    np.testing.assert_array_equal(np.stack(result), [[i, 2 * i] for i in items])
    assert calls == [7, 3, 1, 2, 4, 2, 2]
    assert len(recovered) == 3  # one per failed attempt


def test_a_single_item_that_does_not_fit_is_resource_exhausted() -> None:
    with pytest.raises(ResourceExhausted) as raised:
        run_isolating_failures(embed_fitting(0, []), [1, 2], is_oom=is_cuda_oom)
    assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.reason == "DEVICE_OUT_OF_MEMORY"
    assert "out of device memory on a single item" in raised.value.message


def test_a_failing_item_is_isolated_and_the_others_get_their_outputs() -> None:
    calls: list[int] = []

    def fails_on_three(items):
        calls.append(len(items))
        if 3 in items:
            raise IndexError("index out of range in self")
        return [item * 10 for item in items]

    outcomes = run_isolating_failures(fails_on_three, [1, 2, 3, 4], is_oom=is_cuda_oom)
    assert outcomes[:2] == [10, 20] and outcomes[3] == 40
    assert isinstance(outcomes[2], InvalidArgument)
    assert outcomes[2].reason == "ITEM_FAILED"
    assert "IndexError: index out of range in self" in outcomes[2].message
    assert calls == [4, 2, 2, 1, 1]


def test_when_every_item_fails_the_error_is_raised_for_the_batch() -> None:
    calls: list[int] = []

    def broken(items):
        calls.append(len(items))
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_isolating_failures(broken, [1, 2, 3], is_oom=is_cuda_oom)
    assert calls == [3, 1, 2, 1, 1]


def test_a_sie_error_answers_the_whole_batch_without_splitting() -> None:
    calls: list[int] = []

    def refuses(items):
        calls.append(len(items))
        raise ResourceExhausted("no room", reason="TEST")

    with pytest.raises(ResourceExhausted):
        run_isolating_failures(refuses, [1, 2, 3, 4], is_oom=is_cuda_oom)
    assert calls == [4]
