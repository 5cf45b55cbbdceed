"""Qwen3-VL rerankers (Qwen/Qwen3-VL-Reranker-2B): transformers' Qwen3VLForConditionalGeneration reads a judge
prompt (a system turn asking for "yes" or "no"; a user turn of `<Instruct>: ` and the instruction, `<Query>:` and
the query, `\\n<Document>:` and the document's image, then its text; the assistant's turn opened) and the score is
sigmoid(h . (w_yes - w_no)), h the final layer's hidden state at the last token and w the output embedding rows of
"yes" and "no", as the model's reference code (Qwen3VLReranker.process) computes it.

The query is a text; a document a text, an image or both. The instruction: the request's, else run_options
`default_instruction` (the reference's "Given a search query, retrieve relevant candidates that answer the query.").
Over max_sequence_length (default 10240, the reference's) the prompt is cut as the reference cuts it: its last five
tokens (the end of the user's turn and the assistant's opening) kept, and before them every special token (the
image's among them) and as many of the first other tokens as fit; the tokens' modalities are cut alike (the
reference's are not, which breaks its M-RoPE positions on an over-length prompt with an image). Pairs are batched,
right-padded, each read at its last real token (the reference scores one pair at a time). Images: see
sie_worker.adapters.layers.qwen_vl_chat.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from transformers import Qwen3VLForConditionalGeneration, Qwen3VLModel

from sie_worker.adapters.contract import AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.layers.qwen_vl_chat import (
    MAX_INSTRUCTION_TOKENS,
    ChatInputs,
    QwenVlChat,
    batched,
    check_model_type,
    last_tokens,
    max_tokens,
)
from sie_worker.adapters.spec import AdapterSpec

SYSTEM_PROMPT = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)
DEFAULT_INSTRUCTION = "Given a search query, retrieve relevant candidates that answer the query."
DEFAULT_MAX_TOKENS = 10240
# The prompt's tokens after the document that truncation keeps (the reference's: `<|im_end|>\n<|im_start|>assistant\n`).
TAIL_TOKENS = 5


class Qwen3VlReranker(HfAdapter):
    spec = AdapterSpec(
        "qwen3_vl_reranker", tasks=("score",), inputs=("text", "image"), pairs=True, text_with_image=True
    )

    model: Qwen3VLModel

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        config = check_model_type(context.weights)
        # The decoder alone is kept: the score reads two rows of the output embeddings, kept as their difference.
        full = self.load(Qwen3VLForConditionalGeneration)
        self.model = full.model
        self.max_sequence_length = max_tokens(context.config.max_sequence_length, DEFAULT_MAX_TOKENS, config)
        self.chat = QwenVlChat(
            context.weights, dict(context.profile.load_options), self.max_sequence_length, self.model.language_model
        )
        self.default_instruction = str(context.profile.run_options.get("default_instruction", DEFAULT_INSTRUCTION))
        self.chat.check_text(self.default_instruction, "run_options.default_instruction", MAX_INSTRUCTION_TOKENS)
        vocabulary = self.chat.tokenizer.get_vocab()
        missing = [token for token in ("yes", "no") if token not in vocabulary]
        if missing:
            raise ValueError(f"the tokenizer has no token {', '.join(missing)}: not a yes/no reranker")
        rows = full.get_output_embeddings().weight
        self.direction = (rows[vocabulary["yes"]] - rows[vocabulary["no"]]).detach().clone()

    def check(self, query: Query) -> None:
        if query.instruction is not None:
            self.chat.check_instruction(query.instruction)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        """The query read as far as a prompt can hold of it, checked once; then each pair."""
        pair = items[0].pair or "" if items else ""
        try:
            pair = self.chat.readable(pair)
            self.chat.check_text(pair, "query")
        except ValueError as error:
            raise AdapterError(str(error), reason="INVALID_ITEM", metadata={"item": "query"}) from None
        return super().prepare([item._replace(pair=pair) for item in items], query)

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        """The pair's judge prompt, cut to max_sequence_length tokens before its tail."""
        document, image = self.chat.user_content(item.text, item.image)
        content: list[dict[str, Any]] = [
            {"type": "text", "text": "<Instruct>: " + (query.instruction or self.default_instruction)},
            {"type": "text", "text": "<Query>:"},
            {"type": "text", "text": item.pair or ""},
            {"type": "text", "text": "\n<Document>:"},
            *document,
        ]
        messages = [
            {"role": "system", "content": [{"type": "text", "text": SYSTEM_PROMPT}]},
            {"role": "user", "content": content},
        ]
        inputs = self._truncated(self.chat.encode(messages, image))
        return Prepared(inputs, len(inputs.ids))

    def _truncated(self, inputs: ChatInputs) -> ChatInputs:
        body = len(inputs.ids) - TAIL_TOKENS
        if body <= self.max_sequence_length:
            return inputs
        special = self.chat.special_ids
        room = self.max_sequence_length - sum(1 for token in inputs.ids[:body] if token in special)
        kept = []
        for position, token in enumerate(inputs.ids[:body]):
            if token in special:
                kept.append(position)
            elif room > 0:
                kept.append(position)
                room -= 1
        return inputs.cut([*kept, *range(body, len(inputs.ids))])

    def run(self, batch: Sequence[ChatInputs], query: Query) -> np.ndarray:
        inputs = batched(batch, self.chat.pad_id, self.device, self.model.dtype)
        hidden = self.model(**inputs).last_hidden_state
        scores = torch.sigmoid(last_tokens(hidden, batch) @ self.direction)
        return scores.float().cpu().numpy()

    def resized_pixels(self, width: int, height: int) -> int:
        return self.chat.resized_pixels(width, height)
