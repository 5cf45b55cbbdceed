"""NV-Embed (nvidia/NV-Embed-v2): a Mistral decoder run bidirectionally, its token states pooled by latent attention,
served natively from the checkpoint's own layout (config.json `model_type: nvembed`, weights under
`embedding_model.` and `latent_attention_model.`), so no code shipped with the weights runs.

As the checkpoint's own `encode` does: each text is the prompt, the text and the tokenizer's EOS, tokenized with
its BOS, padded on the right; the decoder attends both ways (padding-only mask, no sliding window); and with
`is_mask_instruction` the first `len(tokenize(prompt))` positions are left out of pooling: the BOS and the prompt's
tokens but its last (the reference counts the prompt without the BOS its tokenizer adds, and masks from
position 0). run_options `query_prompt`, `document_prompt`, `instruction_prompt` (with `{instruction}`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from sie_worker.adapters.contract import AdapterError, Input, LoadContext, Prepared, Query
from sie_worker.adapters.families.sentence_transformer import PROMPT_COUNTS_KEPT
from sie_worker.adapters.hf import HfAdapter
from sie_worker.adapters.items import EncodedItem, TokenizedText
from sie_worker.adapters.layers.checkpoint_files import read_json
from sie_worker.adapters.layers.latent_attention import LatentAttentionShape, load_latent_attention
from sie_worker.adapters.layers.native_architectures import native_architecture
from sie_worker.adapters.layers.padding import by_length, padded
from sie_worker.adapters.spec import AdapterSpec
from sie_worker.kernels.bidirectional import use_bidirectional

MODEL_TYPE = "nvembed"
# Where the checkpoint keeps each part's weights.
DECODER_PREFIX = "embedding_model."
POOLING_PREFIX = "latent_attention_model."


class NvEmbedEncoder(HfAdapter):
    spec = AdapterSpec("nv_embed", tasks=("encode",), outputs=("dense",))

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        directory = context.weights
        raw: object = read_json(directory / "config.json")
        if not isinstance(raw, dict):
            raise ValueError(f"{directory}/config.json: not a JSON object")
        if raw.get("model_type") != MODEL_TYPE:
            raise ValueError(
                f"{directory}/config.json: model_type {raw.get('model_type')!r} is not NV-Embed's ({MODEL_TYPE!r})"
            )
        text = raw.get("text_config")
        native = native_architecture(text)
        if native is None or not native.bidirectional or not isinstance(text, dict):
            raise ValueError(
                f"{directory}/config.json: text_config.model_type must be bidir_mistral (a Mistral decoder run "
                "bidirectionally), the one NV-Embed decoder the worker builds natively"
            )
        if raw.get("padding_side", "right") != "right":
            raise ValueError(f"{directory}/config.json: padding_side {raw['padding_side']!r}; NV-Embed pads right")
        self.mask_prompt = raw.get("is_mask_instruction", True)
        if not isinstance(self.mask_prompt, bool):
            raise ValueError(f"{directory}/config.json: is_mask_instruction must be true or false")
        # The reference's mask has no window: every token sees every real token, however far.
        decoder = native.loader({**text, "sliding_window": None, "use_cache": False}, {f"^{DECODER_PREFIX}": ""})
        self.model = self.load(decoder, reads_padding=False)
        self.tokenizer = self.use_tokenizer(self.model)
        self.eos: str = self.tokenizer.hf.eos_token or ""
        use_bidirectional(self.model, self._hidden, self.device)

        latent_config = raw.get("latent_attention_config") or {}
        if not isinstance(latent_config, dict):
            raise ValueError(f"{directory}/config.json: latent_attention_config must be an object")
        shape = LatentAttentionShape.from_config(latent_config, self.model.config.hidden_size)
        self.pooling = load_latent_attention(directory, POOLING_PREFIX, shape, self.device, context.dtype)
        self.normalized = shape.normalize
        self.dims = context.config.dims or shape.width
        if self.dims != shape.width:
            raise ValueError(f"config says dims {self.dims}, but the model gives {shape.width}")
        run_options = dict(context.profile.run_options)
        self.query_prompt = run_options.get("query_prompt", "")
        self.document_prompt = run_options.get("document_prompt", "")
        self.instruction_prompt = run_options.get("instruction_prompt", "{instruction}")
        self._masked_positions = functools.lru_cache(maxsize=PROMPT_COUNTS_KEPT)(self._prompt_length)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        prompt = self.prompt(query)
        masked = self._masked_positions(prompt) if prompt and self.mask_prompt else 0
        encoded = self.tokenizer.encode([prompt + (item.text or "") + self.eos for item in items])
        prepared = []
        for position, item in enumerate(encoded):
            if len(item.ids) <= masked:
                raise AdapterError(
                    f"the prompt (with the instruction in it) fills all {len(item.ids)} tokens the model reads of"
                    " this item, and the model leaves the prompt out of pooling: no token of the text would be pooled",
                    reason="PROMPT_TOO_LONG",
                    metadata={"limit": str(self.max_sequence_length)},
                    item=position,
                )
            prepared.append(Prepared(TokenizedText(item.ids, masked), len(item.ids)))
        return prepared

    def _prompt_length(self, prompt: str) -> int:
        """The prompt's tokens without special ones (at most the model's length), as the reference counts them."""
        return len(self.tokenizer.rust.encode(prompt, add_special_tokens=False).ids)

    def run(self, batch: Sequence[TokenizedText], query: Query) -> list[EncodedItem]:
        return [EncodedItem(dense=row) for row in by_length(batch, self.device, self.embed)]

    def embed(self, batch: Sequence[TokenizedText]) -> np.ndarray:
        """Dense float32 vectors, one row per item, from one forward pass."""
        inputs = padded(batch, self.tokenizer.pad_id, self.device)
        attention = inputs["attention_mask"]
        pool_mask = attention.clone()
        for row, item in enumerate(batch):
            pool_mask[row, : item.prompt_tokens] = 0
        hidden = self._hidden(inputs["input_ids"], attention)
        return self.pooling(hidden, pool_mask).float().cpu().numpy()

    def _hidden(self, input_ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
