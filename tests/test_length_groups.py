"""CPU forward passes split by length: every item once, shortest first, outputs back in the batch's order."""

from __future__ import annotations

import torch

from sie_worker.adapters.items import TokenizedText
from sie_worker.adapters.layers.padding import CPU_SPLIT_TOKENS, by_length, length_groups


def test_a_long_item_among_short_ones_gets_a_pass_of_its_own() -> None:
    lengths = [200] + [20] * 63
    groups = length_groups(lengths, CPU_SPLIT_TOKENS)
    assert groups == [list(range(1, 64)), [0]]


def test_similar_lengths_stay_in_one_pass() -> None:
    lengths = [20 + (index % 3) for index in range(64)]
    assert [sorted(group) for group in length_groups(lengths, CPU_SPLIT_TOKENS)] == [list(range(64))]


def test_groups_cover_every_item_once_in_ascending_length() -> None:
    lengths = [5, 90, 12, 12, 300, 7, 45, 46, 44, 250]
    groups = length_groups(lengths, 16)
    flat = [index for group in groups for index in group]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[index] for index in flat] == sorted(lengths)
    assert len(groups) > 1


def _batch(lengths: list[int]) -> list[TokenizedText]:
    return [TokenizedText(list(range(length))) for length in lengths]


def test_outputs_come_back_in_the_batch_order() -> None:
    batch = _batch([200, 3, 150, 4, 5, 180])
    passes: list[list[int]] = []

    def forward(items):
        passes.append([len(item.ids) for item in items])
        return [len(item.ids) * 10 for item in items]

    assert by_length(batch, torch.device("cpu"), forward) == [2000, 30, 1500, 40, 50, 1800]
    assert len(passes) > 1
    assert all(lengths == sorted(lengths) for lengths in passes)


def test_accelerators_run_the_batch_whole() -> None:
    batch = _batch([200, 3, 150])
    passes: list[int] = []

    def forward(items):
        passes.append(len(items))
        return [len(item.ids) for item in items]

    assert by_length(batch, torch.device("cuda"), forward) == [200, 3, 150]
    assert passes == [3]
