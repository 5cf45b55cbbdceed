"""Fake adapter families, and a real Engine built around them in-process: no subprocess, no weights, no torch model
to load. For tests of what the engine does with any model (plans, parts and batch keys, the device loop, refusals,
answers) in milliseconds.

    async with fake_engine(tmp_path) as engine:
        outcome = await engine.encode(EncodeJob(FAKE_ENCODER, items("a", "b")))

The families compute from the characters of their inputs, so every answer is known in advance (`token_ids`,
`fake_dense`, ...), and each records the batches it ran (`runs`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from sie_common.cluster.bundles import Bundle
from sie_common.cluster.model_config import ModelConfig, parse_model_config
from sie_worker.adapters.contract import Adapter, AdapterError, Input, LoadContext, Prepared, Query, Similarity
from sie_worker.adapters.items import EncodedItem, Entity, Extraction
from sie_worker.adapters.spec import AdapterSpec, Option, whole_number
from sie_worker.engine.engine import Engine
from sie_worker.engine.jobs import ImageInput, ItemInput
from sie_worker.models.catalog import Catalog
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings
from sie_worker.weights.roots import WeightRoots

FAKE_ENCODER = "fake/encoder"
FAKE_SCORER = "fake/scorer"
FAKE_EXTRACTOR = "fake/extractor"
# The longest text the fakes read, in characters (one token each).
FAKE_MAX_LENGTH = 64
FAKE_DIMS = 4


def token_ids(text: str) -> list[int]:
    """A fake's tokens of a text: one per character, cut at FAKE_MAX_LENGTH."""
    return [ord(character) % 97 + 1 for character in text[:FAKE_MAX_LENGTH]]


def fake_dense(ids: Sequence[int]) -> np.ndarray:
    """The fake encoder's dense vector of a text's tokens."""
    return np.array([len(ids), sum(ids) % 1000, ids[0] if ids else 0, 1.0], dtype=np.float32)


def fake_multivector(ids: Sequence[int]) -> np.ndarray:
    """Its multivector: one row (id, 1) per token."""
    return np.array([[token, 1.0] for token in ids], dtype=np.float32).reshape(len(ids), 2)


class _Fake(Adapter):
    """What the fakes share: a torch module for the LoRA and memory code to read, and the batches they ran."""

    def __init__(self, context: LoadContext) -> None:
        self.model = torch.nn.Linear(1, 1)
        self.max_sequence_length = FAKE_MAX_LENGTH
        # (modality, items) of every batch `run` got, in order.
        self.runs: list[tuple[str, int]] = []


class FakeEncoder(_Fake):
    """Dense and multivector embeddings of texts (after "q: " for queries, or the instruction) and images (from their
    width and height); a batch holding the text "boom" fails."""

    spec = AdapterSpec(
        "fake_encoder",
        tasks=("encode", "score"),
        inputs=("text", "image"),
        outputs=("dense", "multivector"),
        options=(Option("compare", "multivector: a score compares multivectors (MaxSim)", tasks=("score",)),),
    )

    def __init__(self, context: LoadContext) -> None:
        super().__init__(context)
        self.dims = FAKE_DIMS
        self.multivector_dims = 2

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        if query.modality == "image":
            sizes = [item.decoded_image().size for item in items]
            return [Prepared([width % 97 + 1, height % 97 + 1], 1, 2) for width, height in sizes]
        prompt = query.instruction if query.instruction is not None else ("q: " if query.is_query else "")
        ids = [token_ids(prompt + (item.text or "")) for item in items]
        return [Prepared(tokens, len(tokens), len(tokens)) for tokens in ids]

    def run(self, batch: Sequence[Any], query: Query) -> list[EncodedItem]:
        self.runs.append((query.modality, len(batch)))
        if any(ids == token_ids("boom") for ids in batch):
            raise RuntimeError("the fake fails on 'boom'")
        return [EncodedItem(dense=fake_dense(ids), multivector=fake_multivector(ids)) for ids in batch]

    def resized_pixels(self, width: int, height: int) -> int:
        return width * height

    def scoring(self, options: Mapping[str, Any]) -> tuple[tuple[str, ...], Similarity] | None:
        if options.get("compare") == "multivector":
            return ("multivector",), fake_maxsim
        return None


def fake_maxsim(query: EncodedItem, item: EncodedItem) -> float:
    """The sum over the query's rows of their best dot product with the item's."""
    return float((query.vector("multivector") @ item.vector("multivector").T).max(axis=1).sum())


class FakeScorer(_Fake):
    """A pair scorer: the share of the query's characters each text has."""

    spec = AdapterSpec("fake_scorer", tasks=("score",), pairs=True)

    def prepare(self, items: Sequence[Input], query: Query) -> list[Prepared]:
        pair = set((query.instruction or "") + (items[0].pair or "") if items else "")
        return [Prepared((pair, item.text or ""), len(item.text or "") + 1) for item in items]

    def run(self, batch: Sequence[Any], query: Query) -> np.ndarray:
        self.runs.append((query.modality, len(batch)))
        return np.array([len(pair & set(text)) / max(len(pair), 1) for pair, text in batch], dtype=np.float32)


class FakeExtractor(_Fake):
    """Finds each label in each text (case-sensitive) as an entity; a text with "unreadable" in it is refused, a
    label "forbidden" too (INVALID_LABEL); option `max_found` (1 to 10) keeps the first ones found."""

    spec = AdapterSpec(
        "fake_extractor",
        tasks=("extract",),
        labels=True,
        options=(Option("max_found", "entities kept per item", lambda value: whole_number(value, "max_found", 1, 10)),),
    )

    def check(self, query: Query) -> None:
        if "forbidden" in query.labels:
            raise AdapterError("labels: 'forbidden' is not a label", reason="INVALID_LABEL")

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        text = item.text or ""
        if "unreadable" in text:
            raise ValueError("this text cannot be read")
        return Prepared(text, len(text) + 1)

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        self.runs.append((query.modality, len(batch)))
        return [sorted((text.find(label), label) for label in query.labels if label in text) for text in batch]

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Extraction:
        keep = int(query.options.get("max_found", 10))
        return Extraction(
            entities=[
                Entity(text=label, label=label, score=1.0, start=start, end=start + len(label))
                for start, label in output[:keep]
            ]
        )


FAKES: Mapping[str, type[Adapter]] = {cls.spec.name: cls for cls in (FakeEncoder, FakeScorer, FakeExtractor)}
# Model id -> its config after `id` and `path`.
FAKE_MODELS: dict[str, dict[str, Any]] = {
    FAKE_ENCODER: {
        "inputs": ["text", "image"],
        "tasks": ["encode", "score"],
        "output_types": ["dense", "multivector"],
        "loras": {"tuned": "lora-tuned"},
        "profiles": {"default": {"adapter": "fake_encoder"}},
    },
    FAKE_SCORER: {"tasks": ["score"], "profiles": {"default": {"adapter": "fake_scorer"}}},
    FAKE_EXTRACTOR: {"tasks": ["extract"], "profiles": {"default": {"adapter": "fake_extractor"}}},
}


def items(*texts: str, images: Sequence[bytes] = ()) -> list[ItemInput]:
    """Items of `texts`, then of `images` (encoded image files), positioned and named by their place."""
    made = [ItemInput(text, (), f"t{index}", index) for index, text in enumerate(texts)]
    return made + [
        ItemInput(None, (ImageInput(data),), f"i{index}", len(texts) + index) for index, data in enumerate(images)
    ]


@contextlib.asynccontextmanager
async def fake_engine(directory: Path, **settings: Any) -> AsyncIterator[Engine]:
    """A started Engine serving the fake models (their weights: empty directories under `directory`), every model
    preloaded; `settings`: WorkerSettings fields to change."""
    configs: dict[str, ModelConfig] = {}
    for model_id, body in FAKE_MODELS.items():
        weights = directory / model_id.replace("/", "--")
        weights.mkdir(parents=True, exist_ok=True)
        configs[model_id] = parse_model_config({"id": model_id, "path": str(weights), **body}, source=model_id)
    worker = WorkerSettings(
        models_dir=str(directory / "no-configs"),
        weight_roots=(str(directory),),
        preload_models=tuple(configs),
        **settings,
    )
    catalog = Catalog(Bundle("fakes", tuple(FAKES)), configs, weight_roots=WeightRoots([directory]))
    engine = Engine(worker, ModelRegistry(catalog, worker, torch.device("cpu"), FAKES))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


def adapter_of(engine: Engine, model_id: str) -> Any:
    """The loaded fake of `model_id` (to read the batches it ran)."""
    (model,) = engine.registry.loaded(model_id)
    return model.adapter
