"""Zero-shot entity extraction with labels given per request, through the optional `gliner` package.

The model loads from its resolved local directory only (`local_files_only`): the tokenizer saved with it
(else the backbone's, from the local Hugging Face cache) and the backbone built from the saved
`encoder_config`. GLiNER builds backbones with `trust_remote_code=True`; a checkpoint whose backbone
config names code to run (`auto_map`) is refused unless the profile sets `trust_remote_code`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sie_common.errors import FailedPrecondition
from sie_worker.adapters.base import Entity, LoadContext, ZeroShotExtractor

DEFAULT_THRESHOLD = 0.5
# Backbone configs in gliner_config.json that GLiNER builds models from.
_BACKBONE_CONFIGS = ("encoder_config", "labels_encoder_config", "labels_decoder_config", "span_encoder_config")


def require_gliner(model_id: str) -> None:
    """FAILED_PRECONDITION, saying what to install, when the gliner package or one it imports is missing."""
    try:
        importlib.import_module("gliner")
    except ModuleNotFoundError as missing:
        package = missing.name or "gliner"
        raise FailedPrecondition(
            f"model {model_id} needs the 'gliner' package, which cannot be imported in this worker (missing module {package!r}); "
            "install the engine's gliner extra (pip install gliner --no-deps && pip install '.[gliner]', see docs/models.md) "
            "or serve the model from a worker image that has it",
            reason="ADAPTER_DEPENDENCY_MISSING",
            metadata={"model": model_id, "package": package},
        ) from None


def refuse_remote_code(directory: Path, trust_remote_code: bool) -> None:
    """A ValueError (a permanent load failure) when a backbone config asks for shipped code the profile does not trust."""
    if trust_remote_code:
        return
    config: dict[str, Any] = json.loads((directory / "gliner_config.json").read_text(encoding="utf-8"))
    for key in _BACKBONE_CONFIGS:
        backbone = config.get(key)
        if isinstance(backbone, dict) and backbone.get("auto_map"):
            raise ValueError(
                f"{directory / 'gliner_config.json'}: {key} names code shipped with the weights (auto_map); "
                "set load_options.trust_remote_code: true to run it"
            )


class GlinerExtractor(ZeroShotExtractor):
    tasks = ("extract",)
    output_types: tuple[str, ...] = ()
    dims = 0

    def __init__(self, context: LoadContext) -> None:
        require_gliner(context.config.id)
        from gliner import GLiNER

        refuse_remote_code(context.weights, context.profile.trust_remote_code)
        self.extractor = GLiNER.from_pretrained(
            str(context.weights), local_files_only=True, map_location=str(context.device), max_length=context.config.max_sequence_length
        )
        self.extractor.to(context.device).eval()
        self.model = self.extractor.model
        self.max_sequence_length = int(self.extractor.config.max_len)

    def extract(self, texts: Sequence[str], labels: Sequence[str], threshold: float | None) -> list[list[Entity]]:
        found = self.extractor.inference(
            list(texts), list(labels), threshold=DEFAULT_THRESHOLD if threshold is None else threshold, batch_size=max(1, len(texts))
        )
        return [
            [Entity(text=text[e["start"] : e["end"]], label=e["label"], score=float(e["score"]), start=e["start"], end=e["end"]) for e in entities]
            for text, entities in zip(texts, found)
        ]
