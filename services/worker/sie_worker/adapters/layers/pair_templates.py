"""How a causal-LM reranker reads a (query, document) pair: one prompt text per pair, instruction included.

A `TextTemplate` comes from a model config (load_options `template`); a `ChatTemplate` is the tokenizer's
chat template, rendered with the messages sentence-transformers' CrossEncoder builds for a pair.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

_PLACEHOLDER = re.compile(r"\{(instruction|query|document)\}")
# Contents a chat template must carry into its output for a pair.
_PROBES = ("query-probe-7f3a", "document-probe-7f3a")
# The most characters a chat template may render around a pair: each pair renders it again (a downloaded
# template's `'x' * 10**8` made every pair a 100 MB text to tokenize); real ones are a few hundred.
MAX_CHAT_TEMPLATE_CHARS = 64 * 1024


class PairTemplate(Protocol):
    def render(self, query: str, document: str, instruction: str | None) -> list[str]:
        """The whole model input of one pair as texts, each tokenized on its own and the tokens joined in order (one
        text, unless the template is written in pieces). Thread-safe."""


class TextTemplate:
    """A text with `{query}` and `{document}` (once each) and optionally `{instruction}`, where a request's
    instruction goes through `instruction_prompt` (`{instruction}` where it goes); no instruction leaves it empty.
    Placeholders are filled in one pass, so braces in the texts stay as they are.

    The template may be a list of texts, its pieces: each is tokenized on its own, as a library that tokenizes its
    prompt in parts does (mxbai-rerank: the query part, each separator, the document part, the task apart), so
    tokens never join across two pieces (Qwen2's tokenizer makes one token of `?` and a newline after it)."""

    def __init__(self, template: str | list[str], instruction_prompt: str = "{instruction}") -> None:
        pieces = [template] if isinstance(template, str) else template
        if not isinstance(pieces, list) or not pieces or not all(isinstance(piece, str) for piece in pieces):
            raise ValueError("load_options.template must be a text or a list of texts")
        for name in ("query", "document"):
            if sum(piece.count("{" + name + "}") for piece in pieces) != 1:
                raise ValueError(f"load_options.template must contain {{{name}}} exactly once")
        self.pieces = list(pieces)
        self.instruction_prompt = instruction_prompt

    def render(self, query: str, document: str, instruction: str | None) -> list[str]:
        values = {
            "instruction": self.instruction_prompt.replace("{instruction}", instruction) if instruction else "",
            "query": query,
            "document": document,
        }
        return [_PLACEHOLDER.sub(lambda match: values[match.group(1)], piece) for piece in self.pieces]


class ChatTemplate:
    """The tokenizer's chat template over a `system` message holding the instruction (when there is one), then a
    `query` and a `document` message, as sentence-transformers maps a pair onto roles. `flat` messages carry their
    text as content; structured ones a list of typed parts (sentence_bert_config.json says which)."""

    def __init__(self, tokenizer: Any, *, flat: bool) -> None:
        self.tokenizer = tokenizer
        self.flat = flat
        # A chat template made for chat drops these roles (or refuses them): scores would be silently wrong.
        try:
            probe = self.render(_PROBES[0], _PROBES[1], None)[0]
        except Exception as error:  # the template's own error (jinja raise_exception, a missing key)
            raise ValueError(
                f"the model's chat template cannot render a query/document pair ({error}); set load_options.template"
            ) from error
        if not all(text in probe for text in _PROBES):
            raise ValueError(
                "the model's chat template does not render 'query' and 'document' messages; set load_options.template"
            )
        if len(probe) > MAX_CHAT_TEMPLATE_CHARS:
            raise ValueError(
                f"the model's chat template renders {len(probe)} characters for a short pair (at most "
                f"{MAX_CHAT_TEMPLATE_CHARS})"
            )

    def render(self, query: str, document: str, instruction: str | None) -> list[str]:
        system = [self._message("system", instruction)] if instruction else []
        messages = [*system, self._message("query", query), self._message("document", document)]
        return [self.tokenizer.apply_chat_template(messages, tokenize=False)]

    def _message(self, role: str, text: str) -> dict[str, Any]:
        return {"role": role, "content": text if self.flat else [{"type": "text", "text": text}]}
