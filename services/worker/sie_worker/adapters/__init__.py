"""Model adapters by the name model profiles use in `adapter:`."""

from __future__ import annotations

from collections.abc import Callable

from sie_worker.adapters.base import LoadContext, TextEncoder
from sie_worker.adapters.sentence_transformer import SentenceTransformerEncoder

ADAPTERS: dict[str, Callable[[LoadContext], TextEncoder]] = {
    "sentence_transformer": SentenceTransformerEncoder,
}
