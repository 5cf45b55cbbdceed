"""Zero-shot entity extraction with labels given per request, through the optional `gliner` package."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from sie_common.errors import FailedPrecondition
from sie_worker.adapters.base import Entity, LoadContext, ZeroShotExtractor

DEFAULT_THRESHOLD = 0.5


def gliner_installed() -> bool:
    return importlib.util.find_spec("gliner") is not None


def require_gliner(model_id: str) -> None:
    """FAILED_PRECONDITION, saying what to install, when the gliner package is missing."""
    if not gliner_installed():
        raise FailedPrecondition(
            f"model {model_id} needs the 'gliner' package, which is not installed in this worker; "
            "install it (pip install gliner) or serve the model from a worker image that has it",
            reason="ADAPTER_DEPENDENCY_MISSING",
            metadata={"model": model_id, "package": "gliner"},
        )


class GlinerExtractor(ZeroShotExtractor):
    tasks = ("extract",)
    output_types: tuple[str, ...] = ()
    dims = 0

    def __init__(self, context: LoadContext) -> None:
        require_gliner(context.config.id)
        from gliner import GLiNER

        self.extractor = GLiNER.from_pretrained(str(context.weights), local_files_only=True).to(context.device).eval()
        self.model = self.extractor.model
        self.max_sequence_length = int(context.config.max_sequence_length or 384)

    def extract(self, texts: Sequence[str], labels: Sequence[str], threshold: float | None) -> list[list[Entity]]:
        found = self.extractor.batch_predict_entities(list(texts), list(labels), threshold=threshold or DEFAULT_THRESHOLD)
        return [
            [Entity(text=text[e["start"] : e["end"]], label=e["label"], score=float(e["score"]), start=e["start"], end=e["end"]) for e in entities]
            for text, entities in zip(texts, found)
        ]
