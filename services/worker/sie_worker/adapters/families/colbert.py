"""ColBERT-style multivector encoders: one projected (by default L2-normalized) vector per token.

The directory is a `transformers` encoder plus its projection in one of the layouts
`sie_worker.adapters.layers.colbert_layout` reads (Stanford, PyLate, sentence-transformers MultiVectorEncoder),
which also gives the markers, lengths, query expansion and skiplist. load_options override them:

- `query_marker` / `document_marker`: marker tokens inserted after the first token ([CLS]);
- `query_length`: queries are cut to it and, with `query_expansion` (bool), padded to it with [MASK] tokens,
  which the encoder attends to only with `attend_to_expansion_tokens`; every query position yields a vector;
- `mask_punctuation`: document vectors of punctuation tokens are dropped (false: none are);
  document padding is always dropped.

The model config's `max_sequence_length` overrides the directory's document length.
"""

from __future__ import annotations

import dataclasses
import string
from collections.abc import Sequence

import torch
from tokenizers import Tokenizer
from transformers import AutoModel

from sie_worker.adapters.contract import Input, LoadContext, Prepared, Query
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, TokenizedText
from sie_worker.adapters.layers.colbert_layout import ColbertLayout, read_layout
from sie_worker.adapters.layers.padding import model_inputs, padded
from sie_worker.adapters.spec import AdapterSpec


class ColbertEncoder(HfAdapter):
    spec = AdapterSpec("colbert", tasks=("encode", "score"), outputs=("multivector",))

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        layout = _with_options(read_layout(context.weights), dict(context.profile.load_options))
        _check_settings(layout)
        self.layout = layout
        self.model = self.load(AutoModel)
        _check_projections(layout.projections, int(self.model.config.hidden_size))
        self.normalized = layout.normalize
        # A marker takes one position of the length limit, as the checkpoint was trained.
        reserve = int(layout.prefix_tokens and bool(layout.document_prefix))
        self.tokenizer = self.use_tokenizer(self.model, default_length=layout.document_length, reserve=reserve)
        if not layout.prefix_tokens:  # prefixes of text before the input (markers are tokens, inserted by `prepare`)
            self.query_prompt, self.document_prompt = layout.query_prefix, layout.document_prefix
        vocab = self.tokenizer.rust
        self.query_marker = _marker_id(vocab, layout.query_prefix) if layout.prefix_tokens else None
        self.document_marker = _marker_id(vocab, layout.document_prefix) if layout.prefix_tokens else None
        expansion = layout.expansion_token or self.tokenizer.hf.mask_token or self.tokenizer.hf.eos_token
        self.expansion_id = _token_id(vocab, expansion)
        self.skip_ids = {token for token in map(vocab.token_to_id, layout.skiplist_words) if token is not None}
        self.projections = [
            (weight.to(context.device, context.dtype), None if bias is None else bias.to(context.device, context.dtype))
            for weight, bias in layout.projections
        ]
        self.multivector_dims = int(layout.projections[-1][0].shape[0])

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        tokenized = self.tokenize([item.text or "" for item in items], self.prompt(query), is_query=query.is_query)
        return [Prepared(item, len(item.ids), self.multivector_rows(item)) for item in tokenized]

    def tokenize(self, texts: Sequence[str], prompt: str, *, is_query: bool) -> list[TokenizedText]:
        """Each text after the prompt, with its marker; a query cut to the query length (and expanded to it)."""
        marker = self.query_marker if is_query else self.document_marker
        layout = self.layout
        # Cut to, and expanded no further than, what the model reads (a stated query length may be far longer).
        query_cap = min(layout.query_length or self.max_sequence_length, self.max_sequence_length)
        items = []
        for encoded in self.tokenizer.encode([prompt + text for text in texts]):
            ids = encoded.ids if marker is None else [*encoded.ids[:1], marker, *encoded.ids[1:]]
            if is_query:
                if len(ids) > query_cap:
                    ids = [*ids[: query_cap - 1], ids[-1]]
                if layout.query_expansion:
                    ids += [self.expansion_id] * ((query_cap if layout.query_length else 0) - len(ids))
            items.append(TokenizedText(ids, is_query=is_query))
        return items

    def multivector_rows(self, item: TokenizedText) -> int:
        """How many vectors `encode` returns for `item` (the engine refuses an answer too large before running it)."""
        skip = self._skipped(item)
        return sum(token not in skip for token in item.ids)

    def _skipped(self, item: TokenizedText) -> set[int]:
        """The token ids whose vectors `item` drops (the skiplist: documents, and queries where the layout says so)."""
        return self.skip_ids if self.layout.skip_in_queries or not item.is_query else set()

    def run(self, batch: Sequence[TokenizedText], query: Query) -> list[EncodedItem]:
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        attention = inputs["attention_mask"].clone()
        if not self.layout.attend_to_expansion:
            for row, item in enumerate(batch):
                if item.is_query:
                    attention[row, _real_length(item.ids, self.expansion_id) :] = 0
        hidden = self.model(**model_inputs(self.model, {**inputs, "attention_mask": attention})).last_hidden_state
        for weight, bias in self.projections:
            hidden = torch.nn.functional.linear(hidden, weight, bias)
        if self.normalized:
            hidden = torch.nn.functional.normalize(hidden, p=2, dim=-1)
        vectors = hidden.float().cpu().numpy()
        items = []
        for row, item in enumerate(batch):
            skip = self._skipped(item)
            keep = [position for position, token in enumerate(item.ids) if token not in skip]
            items.append(EncodedItem(multivector=vectors[row, keep]))
        return items


def _with_options(layout: ColbertLayout, options: dict) -> ColbertLayout:
    """The directory's layout with the profile's load_options applied."""
    changes: dict = {}
    if "query_marker" in options or "document_marker" in options:
        changes.update(
            prefix_tokens=True,
            query_prefix=options.get("query_marker", "[unused0]"),
            document_prefix=options.get("document_marker", "[unused1]"),
        )
    if "query_length" in options:
        changes["query_length"] = int(options["query_length"])
    if "query_expansion" in options:
        changes["query_expansion"] = bool(options["query_expansion"])
    if "attend_to_expansion_tokens" in options:
        changes["attend_to_expansion"] = bool(options["attend_to_expansion_tokens"])
    if "mask_punctuation" in options:
        changes["skiplist_words"] = tuple(string.punctuation) if options["mask_punctuation"] else ()
    return dataclasses.replace(layout, **changes)


def _check_settings(layout: ColbertLayout) -> None:
    """ValueError for a length that is not a positive integer, a marker or skiplist entry that is not a string: read
    from a downloaded file, they would otherwise fail (or silently bend) every request."""
    for name, value in (("query_length", layout.query_length), ("document_length", layout.document_length)):
        if value is not None and (type(value) is not int or value <= 0):
            raise ValueError(f"ColBERT {name} {value!r} is not a positive integer")
    for name, marker in (
        ("query marker / prefix", layout.query_prefix),
        ("document marker / prefix", layout.document_prefix),
    ):
        if marker is not None and not isinstance(marker, str):  # None (PyLate): no marker
            raise ValueError(f"ColBERT {name} {marker!r} is not a string")
    bad = [word for word in layout.skiplist_words if not isinstance(word, str)]
    if bad:
        raise ValueError(f"ColBERT skiplist_words {bad[:5]!r} are not strings")


def _check_projections(projections: Sequence[tuple[torch.Tensor, torch.Tensor | None]], width: int) -> None:
    """ValueError unless the projections chain from the encoder's `width`: a mismatch would fail every forward pass."""
    for weight, bias in projections:
        if (
            weight.dim() != 2
            or weight.shape[1] != width
            or (bias is not None and tuple(bias.shape) != (weight.shape[0],))
        ):
            shapes = f"{tuple(weight.shape)}" + ("" if bias is None else f" (bias {tuple(bias.shape)})")
            raise ValueError(
                f"ColBERT projection linear.weight {shapes} does not take the {width} values per token it is given"
            )
        width = weight.shape[0]


def _real_length(ids: Sequence[int], expansion_id: int) -> int:
    """Tokens before the trailing expansion tokens."""
    length = len(ids)
    while length and ids[length - 1] == expansion_id:
        length -= 1
    return length


def _marker_id(tokenizer: Tokenizer, marker: str) -> int | None:
    """The token id of a marker (PyLate saves some with a trailing space); None for no marker."""
    if not marker:
        return None
    token_id = tokenizer.token_to_id(marker)
    return token_id if token_id is not None else _token_id(tokenizer, marker.strip())


def _token_id(tokenizer: Tokenizer, token: str | None) -> int:
    token_id = tokenizer.token_to_id(token) if token else None
    if token_id is None:
        raise ValueError(f"token {token!r} is not in the tokenizer's vocabulary")
    return token_id
