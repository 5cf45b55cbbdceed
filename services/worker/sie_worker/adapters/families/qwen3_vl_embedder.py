"""Qwen3-VL embedders (Qwen/Qwen3-VL-Embedding-2B): transformers' Qwen3VLModel reads a chat prompt (a system turn
holding the instruction, a user turn holding the item's image and then its text, the assistant's turn opened) and
the item's embedding is the final layer's hidden state at the last token, L2-normalized (Matryoshka: a request's
`dims` cuts and renormalizes it), as the model's reference code (Qwen3VLEmbedder.process) computes it.

The instruction: the request's, else run_options `query_instruction` for queries (when set), else
run_options `default_instruction` ("Represent the user's input.", the reference's), stripped and ended with a
period unless it ends in punctuation. An item is a text, an image or both (read together, in one prompt). Over
max_sequence_length (default 8192, the reference's) the prompt is cut at its end, as the reference's processor call
truncates it; an image whose tokens would be cut is refused. Images: see sie_worker.adapters.layers.qwen_vl_chat.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, Qwen3VLModel

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem
from sie_worker.adapters.layers.qwen_vl_chat import (
    MAX_INSTRUCTION_TOKENS,
    ChatInputs,
    QwenVlChat,
    batched,
    check_model_type,
    last_tokens,
    max_tokens,
    with_period,
)
from sie_worker.adapters.spec import AdapterSpec

DEFAULT_INSTRUCTION = "Represent the user's input."
DEFAULT_MAX_TOKENS = 8192


class Qwen3VlEmbedder(HfAdapter):
    spec = AdapterSpec(
        "qwen3_vl_embedder",
        tasks=("encode", "score"),
        inputs=("text", "image"),
        outputs=("dense",),
        text_with_image=True,
    )

    model: PreTrainedModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        config = check_model_type(context.weights)
        self.model = self.load(Qwen3VLModel)
        self.max_sequence_length = max_tokens(context.config.max_sequence_length, DEFAULT_MAX_TOKENS, config)
        self.chat = QwenVlChat(
            context.weights, dict(context.profile.load_options), self.max_sequence_length, self.model.language_model
        )
        self.dims = int(config.text_config.hidden_size)
        if context.config.dims and context.config.dims != self.dims:
            raise ValueError(f"config says dims {context.config.dims}, but the model embeds in {self.dims}")
        self.normalized = True
        run = context.profile.run_options
        self.default_instruction = str(run.get("default_instruction", DEFAULT_INSTRUCTION))
        self.query_instruction = run.get("query_instruction")
        self.chat.check_text(self.default_instruction, "run_options.default_instruction", MAX_INSTRUCTION_TOKENS)
        if self.query_instruction is not None:
            self.chat.check_text(str(self.query_instruction), "run_options.query_instruction", MAX_INSTRUCTION_TOKENS)

    def check(self, query: Query) -> None:
        if query.instruction is not None:
            self.chat.check_instruction(query.instruction)

    def instruction(self, query: Query) -> str:
        if query.instruction is not None:
            chosen = query.instruction
        elif query.is_query and self.query_instruction is not None:
            chosen = str(self.query_instruction)
        else:
            chosen = self.default_instruction
        return with_period(chosen) or self.default_instruction

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The item's prompt, cut at max_sequence_length tokens, at the cost of its tokens."""
        content, image = self.chat.user_content(item.text, item.image)
        messages = [
            {"role": "system", "content": [{"type": "text", "text": self.instruction(query)}]},
            {"role": "user", "content": content},
        ]
        inputs = self.chat.encode(messages, image)
        if len(inputs.ids) > self.max_sequence_length:
            if 1 in inputs.types[self.max_sequence_length :]:
                raise ValueError(
                    f"the image's tokens end past the model's {self.max_sequence_length} tokens; send a smaller image "
                    "or a shorter instruction"
                )
            inputs = inputs.cut(range(self.max_sequence_length))
        return Prepared(inputs, len(inputs.ids))

    def run(self, batch: Sequence[ChatInputs], query: Query) -> list[EncodedItem]:
        inputs = batched(batch, self.chat.pad_id, self.device, self.model.dtype)
        hidden = self.model(**inputs).last_hidden_state
        vectors = torch.nn.functional.normalize(last_tokens(hidden, batch).float(), p=2, dim=-1)
        return [EncodedItem(dense=row) for row in vectors.cpu().numpy()]

    def resized_pixels(self, width: int, height: int) -> int:
        return self.chat.resized_pixels(width, height)
