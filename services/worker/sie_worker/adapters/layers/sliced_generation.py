"""What the generating families share (document_reader, ocr_vlm): loading a model and its processor, generate()'s own
preparation of the logits processors, and the turn of a sliced generation (docs/batching.md, "How generation shares
the device"): new items start a state per group, paused ones (`Continued`) resume theirs, each state runs one slice
of decode steps, and an item that ended leaves with its output while the others answer `Continued`."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

import torch
from transformers import AutoProcessor

from sie_worker.adapters.contract import Continued
from sie_worker.adapters.spec import Option, whole_number

DEFAULT_DECODE_STEPS = 32
MAX_DECODE_STEPS = 1024


class SlicedState(Protocol):
    """A generation state: the ids of its live items (positions in the batch that started it) and the outputs of
    those that ended, by id."""

    rows: list[int]
    done: dict[int, Any]


def load_generator(
    model_class: Any, weights: str, dtype: torch.dtype, device: torch.device, processor: Any = None
) -> tuple[Any, Any]:
    """The model (`model_class`, in eval mode on `device`) and its processor (`processor` where given, else
    AutoProcessor's), from local files only. Typed loosely: the generation helpers used are GenerationMixin's, which
    the stubs do not give every class."""
    generator: Any = model_class.from_pretrained(weights, local_files_only=True, dtype=dtype)
    generator.to(device).eval()
    if processor is None:
        processor = AutoProcessor.from_pretrained(weights, local_files_only=True)
    return generator, processor


def max_new_tokens_option(bound: int) -> Option:
    """The request option `max_new_tokens`, 1 to `bound`."""
    return Option(
        "max_new_tokens",
        f"most tokens generated, 1 to {bound}",
        lambda value: whole_number(value, "max_new_tokens", 1, bound),
    )


def decode_steps(run_options: Any) -> int:
    """run_options.decode_steps: decode steps per slice."""
    value = run_options.get("decode_steps", DEFAULT_DECODE_STEPS)
    return whole_number(value, "run_options.decode_steps", 1, MAX_DECODE_STEPS)


def logits_processors(
    generator: Any, prompt_length: int, max_new_tokens: int, num_beams: int, *, has_mask: bool, device: torch.device
) -> tuple[Any, Any]:
    """generate()'s own preparation of the generation config (the model's, then transformers' defaults, read with
    do_sample=False), its special tokens and its logits processors, so the tokens chosen are its: (config,
    processors)."""
    config, _ = generator._prepare_generation_config(
        None, do_sample=False, num_beams=num_beams, num_return_sequences=1, max_new_tokens=max_new_tokens
    )
    config.max_length = prompt_length + max_new_tokens
    generator._prepare_special_tokens(config, kwargs_has_attention_mask=has_mask, device=device)
    processors = generator._get_logits_processor(
        generation_config=config, input_ids_seq_length=prompt_length, device=str(device)
    )
    return config, processors


def run_turn(
    batch: Sequence[Any],
    group: Callable[[Any], Hashable],
    start: Callable[[list[Any], list[int]], SlicedState],
    keep: Callable[[Any, list[int]], None],
    advance: Callable[[Any], None],
) -> list[Any]:
    """One turn of a sliced generation over `batch` (all new prepared items, or all `Continued`): new items are
    grouped by `group` and each group `start`s a state (given the items and their positions); paused items' states
    are narrowed by `keep` to the items still asked for; every state `advance`s one slice. Per item, its output once
    it ended, else `Continued`."""
    groups: dict[int, tuple[Any, list[int]]] = {}
    if isinstance(batch[0], Continued):
        for position, paused in enumerate(batch):
            groups.setdefault(id(paused.state), (paused.state, []))[1].append(position)
        for state, positions in groups.values():
            keep(state, [batch[position].row for position in positions])
    else:
        keys: dict[Hashable, list[int]] = {}
        for position, item in enumerate(batch):
            keys.setdefault(group(item), []).append(position)
        for positions in keys.values():
            state = start([batch[position] for position in positions], positions)
            groups[id(state)] = (state, positions)
    outputs: list[Any] = [None] * len(batch)
    for state, positions in groups.values():
        advance(state)
        for position in positions:
            paused = batch[position]
            row = paused.row if isinstance(paused, Continued) else position
            outputs[position] = state.done.pop(row) if row in state.done else Continued(state, row)
    return outputs


def kept_index(state: SlicedState, rows: list[int], device: torch.device) -> torch.Tensor | None:
    """The positions in `state` of `rows` (its items to keep, in their order), to narrow its per-item tensors by;
    None when it keeps them all. Sets `state.rows`."""
    if rows == state.rows:
        return None
    if not set(rows) <= set(state.rows):
        # A failed slice is retried in halves (run_isolating_failures): the first half narrowed the shared state.
        raise RuntimeError("this item's generation state was dropped after a failed slice of its batch")
    index = torch.tensor([state.rows.index(row) for row in rows], device=device, dtype=torch.long)
    state.rows = list(rows)
    return index
