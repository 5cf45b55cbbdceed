"""Beam search one decode step at a time, so a generation can pause between steps (the sliced generation of
docs/batching.md) and lose items that end without waiting for the others.

Each step is transformers' own vectorised beam search step (`GenerationMixin._beam_search`): the same helpers pick
the continuations, keep the finished hypotheses and decide when an item can stop, so an item's tokens are those of
`generate(num_beams=n)` for it alone. The caller runs the model on `flat_ids()` (items x beams rows), applies the
logits processors to the log-softmax of the last logits and hands them to `step`, then reorders its cache by the
indices `step` returns.
"""

from __future__ import annotations

from typing import Any

import torch


class BeamSearch:
    """The beam state of a batch of items sharing a prompt length: running beams, finished hypotheses, scores."""

    def __init__(self, generator: Any, config: Any, prompt: torch.Tensor, stopping: Any) -> None:
        """`generator`: the model (a GenerationMixin); `config`: its prepared generation config (num_beams,
        max_length, length_penalty, early_stopping, special tokens); `prompt`: [items, prompt length] decoder ids;
        `stopping`: the stopping criteria generate() would use (max length, end-of-text)."""
        self.generator = generator
        self.stopping = stopping
        self.num_beams = int(config.num_beams)
        self.length_penalty = float(config.length_penalty)
        self.early_stopping = config.early_stopping
        self.max_length = int(config.max_length)
        items, self.prompt_length = prompt.shape
        self.cur_len = self.prompt_length
        eos = config._eos_token_tensor
        self.beams_to_keep = max(2, 1 + (eos.shape[0] if eos is not None else 0)) * self.num_beams
        device = prompt.device
        self.top_num_beam_mask = torch.arange(self.beams_to_keep, device=device) < self.num_beams
        pad = config._pad_token_tensor
        fill = pad if pad is not None else (eos[0] if eos is not None else -1)
        self.running = torch.full((items, self.num_beams, self.max_length), int(fill), dtype=torch.int64, device=device)
        self.running[:, :, : self.prompt_length] = prompt[:, None, :]
        self.sequences = self.running.clone()
        self.running_scores = torch.zeros((items, self.num_beams), dtype=torch.float, device=device)
        self.running_scores[:, 1:] = -1e9
        self.scores = torch.full((items, self.num_beams), -1e9, dtype=torch.float, device=device)
        self.finished = torch.zeros((items, self.num_beams), dtype=torch.bool, device=device)
        self.improvable = torch.ones((items, 1), dtype=torch.bool, device=device)
        generated = self.max_length - self.prompt_length
        self.running_indices = torch.full((items, self.num_beams, generated), -1, dtype=torch.int32, device=device)
        self.indices = self.running_indices.clone()

    def flat_ids(self) -> torch.Tensor:
        """[items x beams, length so far]: the decoder ids of every running beam."""
        return self.generator._flatten_beam_dim(self.running[:, :, : self.cur_len])

    def step(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, list[bool]]:
        """One step from the processed log-probabilities of the next token ([items x beams, vocabulary]). Returns the
        flat beam index each next row continues (to reorder the cache by) and, per item, whether it is done."""
        g = self.generator
        items = self.running.shape[0]
        accumulated = g._unflatten_beam_dim(log_probs, items, self.num_beams) + self.running_scores[:, :, None]
        topk_scores, topk_sequences, topk_indices = g._get_top_k_continuations(
            accumulated_log_probs=accumulated.reshape(items, -1),
            running_sequences=self.running,
            running_beam_indices=self.running_indices,
            cur_len=self.cur_len,
            decoder_prompt_len=self.prompt_length,
            do_sample=False,
            beams_to_keep=self.beams_to_keep,
            num_beams=self.num_beams,
            batch_size=items,
        )
        hits = self.stopping(g._flatten_beam_dim(topk_sequences[:, :, : self.cur_len + 1]), None)
        hits = g._unflatten_beam_dim(hits, items, self.beams_to_keep)
        self.running, self.running_scores, self.running_indices = g._get_running_beams_for_next_iteration(
            topk_log_probs=topk_scores,
            topk_running_sequences=topk_sequences,
            topk_running_beam_indices=topk_indices,
            next_token_hits_stopping_criteria=hits,
            num_beams=self.num_beams,
        )
        self.sequences, self.scores, self.indices, self.finished = g._update_finished_beams(
            sequences=self.sequences,
            topk_running_sequences=topk_sequences,
            beam_scores=self.scores,
            topk_log_probs=topk_scores,
            beam_indices=self.indices,
            topk_running_beam_indices=topk_indices,
            is_early_stop_heuristic_unsatisfied=self.improvable,
            is_sent_finished=self.finished,
            next_token_hits_stopping_criteria=hits,
            top_num_beam_mask=self.top_num_beam_mask,
            num_beams=self.num_beams,
            cur_len=self.cur_len,
            decoder_prompt_len=self.prompt_length,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
        )
        reorder = g._flatten_beam_dim(self.running_indices[..., self.cur_len - self.prompt_length]).long()
        self.cur_len += 1
        self.improvable = g._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=self.improvable,
            running_beam_scores=self.running_scores,
            beam_scores=self.scores,
            is_sent_finished=self.finished,
            cur_len=self.cur_len,
            max_length=self.max_length,
            decoder_prompt_len=self.prompt_length,
            early_stopping=self.early_stopping,
            length_penalty=self.length_penalty,
        )
        # generate()'s stopping condition (_beam_search_has_unfinished_sequences), item by item.
        open_beam = ~(self.finished.all(dim=1) & (self.early_stopping is True))
        going = self.improvable[:, 0] & open_beam & ~hits.all(dim=1)
        return reorder, [not bool(value) for value in going.tolist()]

    def best(self, item: int) -> list[int]:
        """The item's best finished sequence, prompt included, as generate() returns it."""
        generated = int((self.indices[item, 0] + 1).bool().sum())
        return self.sequences[item, 0, : self.prompt_length + generated].tolist()

    def keep(self, items: torch.Tensor) -> torch.Tensor:
        """Narrow the state to `items` (indices into the current items); returns the flat rows (items x beams) they
        hold, to narrow the caller's per-row tensors and cache by. The beam indices written before stay as they
        were: only the latest one is read (to reorder), and the finished ones only counted."""
        for name in ("running", "sequences", "running_scores", "scores", "finished", "improvable"):
            setattr(self, name, getattr(self, name)[items])
        self.running_indices = self.running_indices[items]
        self.indices = self.indices[items]
        beams = torch.arange(self.num_beams, device=items.device)
        return (items[:, None] * self.num_beams + beams[None, :]).reshape(-1)
