"""A request's plan: the model that serves it, what it computes, and its items in parts, looked up and checked once.

`plan` is where a job meets its model: every per-model check (task, inputs, LoRA, output types, dims, MUVERA,
options, labels) answers here, with the INVALID_ARGUMENT (or NOT_FOUND, UNAVAILABLE) its caller is told. The plan
carries everything the later stages read: each part's items, the `Query` its adapter runs them with and the batch
key they share forward passes by; then what the answer takes (outputs, MUVERA, dims, dtype, similarity, top_k).
Encode, score and extract differ here and in the answer (sie_worker.engine.answer) only.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sie_common.cluster.model_config import ModelConfig
from sie_common.edge.answer_size import MAX_SEND_SETTING, check_dense_estimate, stated_dims
from sie_common.edge.errors import InvalidArgument, clipped
from sie_worker.adapters.contract import AdapterError, Query, Similarity
from sie_worker.engine.batch_key import BatchKey, batch_key
from sie_worker.engine.jobs import EncodeJob, ExtractJob, ItemInput, ScoreJob
from sie_worker.engine.limits import Limits, check_muvera
from sie_worker.engine.outputs import dense_dims, device_outputs, muvera_params
from sie_worker.engine.postprocess import MuveraParams, cosine, maxsim
from sie_worker.models.build import LoadedModel
from sie_worker.models.registry import ModelRegistry

Job = EncodeJob | ScoreJob | ExtractJob


@dataclass(frozen=True)
class Part:
    """Items of a request that ask the same `query` of the model: prepared together, batched by `key`."""

    # Positions of its items among the plan's items.
    rows: tuple[int, ...]
    query: Query
    key: BatchKey
    # Whether their multivectors count against the request's bounds (an encode's; a score's items, not its query).
    counted: bool = True
    # A pair scorer's: the text each item is scored against (the score's query).
    pair: str | None = None


@dataclass(frozen=True)
class RequestPlan:
    """What one request runs, on which model, and what its answer takes."""

    model: LoadedModel
    task: str  # "encode", "score" or "extract"
    lora: str
    # Every item the request computes: a score's query first, then its items.
    items: tuple[ItemInput, ...]
    parts: tuple[Part, ...]
    # Encode: the outputs the answer carries (the model's default when the job names none).
    outputs: tuple[str, ...] = ()
    # What the forward pass computes: for encode, `outputs` with dense from multivectors where MUVERA makes it;
    # for a score by embeddings, the outputs its similarity compares.
    device_outputs: tuple[str, ...] = ()
    # Encode: whether the items are queries (MUVERA encodes queries and documents differently).
    is_query: bool = False
    # Encode: MUVERA's parameters when dense comes from multivectors.
    muvera: MuveraParams | None = None
    # Encode: the width dense vectors are cut to (None: the model's), and the dtype the answer's vectors take.
    dims: int | None = None
    output_dtype: str = "float32"
    # Score: how a query's and an item's embeddings compare; None where the model scores pairs itself.
    similarity: Similarity | None = None
    top_k: int | None = None

    @property
    def profile(self) -> str:
        return self.model.profile


@dataclass(frozen=True)
class Planner:
    """Plans requests against a worker's registry, within its bounds."""

    registry: ModelRegistry
    limits: Limits
    max_send_bytes: int
    # The device thread, on which a request's LoRA adapter loads.
    device_thread: ThreadPoolExecutor

    def plan(self, job: Job, holds: contextlib.ExitStack) -> RequestPlan:
        """The plan for `job`, with its model held until `holds` closes; raises what the caller is told."""
        if isinstance(job, EncodeJob):
            return self._encode(job, holds)
        if isinstance(job, ScoreJob):
            return self._score(job, holds)
        return self._extract(job, holds)

    def _encode(self, job: EncodeJob, holds: contextlib.ExitStack) -> RequestPlan:
        config = self.registry.config(job.model)
        outputs = job.output_types or config.default_output_types
        _check_outputs(config, outputs)
        # With the dims the config states (the request's where fewer), a too large answer is refused before the load.
        self._check_answer_estimate(job, outputs, stated_dims(job.dims, config.dims))
        model = self._model(holds, config, job.profile, "encode", job.lora, job.items)
        needed = device_outputs(model, outputs)
        muvera = muvera_params(model, job.options) if "dense" in outputs and model.adapter.spec.uses_muvera else None
        if muvera is not None:
            check_muvera(muvera, self.limits)
        width = dense_dims(model, job.options)
        if job.dims is not None and "dense" in outputs and job.dims > width:
            raise InvalidArgument(
                f"dims {job.dims} exceeds the {width} dimensions of {job.model}",
                reason="DIMS_TOO_LARGE",
                metadata={"dims": str(job.dims)},
            )
        if width != config.dims:
            self._check_answer_estimate(job, outputs, job.dims or width)
        _check_one_input_per_item(model, job.items, allow_text_with_image=model.adapter.spec.text_with_image)
        query = Query("encode", outputs=needed, is_query=job.is_query, instruction=job.instruction, options=job.options)
        _check_query(model, "encode", query)
        return RequestPlan(
            model,
            "encode",
            job.lora,
            tuple(job.items),
            _parts(model, job.lora, job.items, query),
            outputs,
            needed,
            job.is_query,
            muvera,
            job.dims,
            job.output_dtype,
        )

    def _check_answer_estimate(self, job: EncodeJob, outputs: tuple[str, ...], dims: int) -> None:
        """RESPONSE_TOO_LARGE before any work when the job's dense vectors of `dims` values alone could not be sent
        (0 dims: not known yet, nothing to refuse)."""
        if "dense" in outputs:
            check_dense_estimate(len(job.items), dims, job.output_dtype, self.max_send_bytes, MAX_SEND_SETTING)

    def _score(self, job: ScoreJob, holds: contextlib.ExitStack) -> RequestPlan:
        config = self.registry.config(job.model)
        model = self._model(holds, config, job.profile, "score", job.lora, [job.query, *job.items])
        adapter = model.adapter
        items = (job.query, *job.items)
        asked = Query("score", instruction=job.instruction, options=job.options)
        _check_query(model, "score", asked)
        if adapter.spec.pairs:
            _check_text_query(model, job.query)
            _check_one_input_per_item(model, job.items, allow_text_with_image=adapter.spec.text_with_image)
            pairs = _parts(model, job.lora, job.items, asked, first_row=1, pair=job.query.text or "")
            return RequestPlan(model, "score", job.lora, items, pairs, top_k=job.top_k)
        outputs, similarity = _similarity(model, job)
        together = adapter.spec.text_with_image
        _check_one_input_per_item(model, [job.query], allow_text_with_image=together)
        _check_one_input_per_item(model, job.items, allow_text_with_image=together)
        # An instruction is the query's (retrieval models encode documents with their document prompt), except on a
        # dual encoder, where it is the prompt of every text (`a photo of `), the items' too.
        item_instruction = job.instruction if "image" in adapter.spec.inputs and not together else None
        query = Query("encode", outputs=outputs, is_query=True, instruction=job.instruction, options=job.options)
        document = Query("encode", outputs=outputs, instruction=item_instruction, options=job.options)
        parts = (
            *_parts(model, job.lora, [job.query], query, counted=False),
            *_parts(model, job.lora, job.items, document, first_row=1),
        )
        return RequestPlan(
            model, "score", job.lora, items, parts, device_outputs=outputs, similarity=similarity, top_k=job.top_k
        )

    def _extract(self, job: ExtractJob, holds: contextlib.ExitStack) -> RequestPlan:
        config = self.registry.config(job.model)
        model = self._model(holds, config, job.profile, "extract", job.lora, job.items)
        spec = model.adapter.spec
        if spec.labels and not job.labels and not (spec.labels_or_option and spec.labels_or_option in job.options):
            raise InvalidArgument(
                f"labels: model {job.model} extracts zero-shot and needs at least one label", reason="NO_LABELS"
            )
        if job.labels and not spec.labels:
            raise InvalidArgument(
                f"labels: model {job.model} (adapter {spec.name}) finds labels of its own and reads none "
                "from the request; send no labels",
                reason="LABELS_NOT_READ",
                metadata={"model": job.model},
            )
        query = Query("extract", labels=job.labels, threshold=job.threshold, options=job.options)
        _check_query(model, "extract", query)
        _check_one_input_per_item(model, job.items, allow_text_with_image=True)
        return RequestPlan(model, "extract", job.lora, tuple(job.items), _parts(model, job.lora, job.items, query))

    def _model(
        self,
        holds: contextlib.ExitStack,
        config: ModelConfig,
        profile: str,
        task: str,
        lora: str,
        items: Sequence[ItemInput] = (),
    ) -> LoadedModel:
        """The loaded model (held until `holds` closes), after checking it does `task`, takes the inputs of `items`
        and has `lora`, which is then made ready."""
        _check_task(config, task)
        _check_inputs(config, items)
        _check_lora(config, lora)
        model = holds.enter_context(self.registry.use(config.id, profile))
        model.loras.require(lora, self.device_thread)
        return model


def _parts(
    model: LoadedModel,
    lora: str,
    items: Sequence[ItemInput],
    query: Query,
    *,
    first_row: int = 0,
    counted: bool = True,
    pair: str | None = None,
) -> tuple[Part, ...]:
    """`items` (rows from `first_row` on) in parts by what reads them: texts, and images (a model's image tower or
    image path), each part batched apart."""
    by_modality: dict[str, list[int]] = {}
    for row, item in enumerate(items, start=first_row):
        by_modality.setdefault(item.modality, []).append(row)
    parts = []
    for modality in ("text", "image"):
        if modality not in by_modality:
            continue
        asked = query if modality == "text" else _image_query(model, query)
        key = batch_key(model.config.id, model.profile, lora, asked)
        parts.append(Part(tuple(by_modality[modality]), asked, key, counted, pair))
    return tuple(parts)


def _image_query(model: LoadedModel, query: Query) -> Query:
    """The query of image items: an encoder's image path reads no prompt (instruction, query or document), except
    where an item's image and text are read together in one prompt (text_with_image)."""
    if query.task != "encode" or model.adapter.spec.text_with_image:
        return dataclasses.replace(query, modality="image")
    return Query("encode", "image", query.outputs, options=query.options)


def _similarity(model: LoadedModel, job: ScoreJob) -> tuple[tuple[str, ...], Similarity]:
    """What a score by embeddings compares: what the model's options pick (BGE-M3), else cosine of dense embeddings
    (dual encoders, text or image), else MaxSim of multivectors (late interaction)."""
    adapter = model.adapter
    try:
        picked = adapter.scoring(job.options)
    except ValueError as error:
        raise InvalidArgument(f"options: {error}", reason="INVALID_OPTIONS") from None
    if picked is not None:
        return picked
    if "image" in adapter.spec.inputs and "dense" in adapter.spec.outputs:
        return ("dense",), _cosine
    return ("multivector",), _maxsim


def _cosine(query: Any, item: Any) -> float:
    return cosine(query.vector("dense"), item.vector("dense"))


def _maxsim(query: Any, item: Any) -> float:
    return maxsim(query.vector("multivector"), item.vector("multivector"))


def _check_query(model: LoadedModel, task: str, query: Query) -> None:
    """Only options the model reads for `task` (its adapter's, and MUVERA's for an encode of a multivector model):
    UNKNOWN_OPTION naming the option and those it reads; each within the bounds the adapter declares for it, then
    what only the model can check (its `check`): INVALID_OPTIONS, or the reason the adapter gives."""
    spec = model.adapter.spec
    accepted = (*spec.option_names(task), *(("muvera",) if task == "encode" and spec.uses_muvera else ()))
    unknown = sorted(set(query.options) - set(accepted))
    if unknown:
        name = clipped(unknown[0])
        raise InvalidArgument(
            f"options.{name}: model {model.config.id} (adapter {spec.name}) reads no option {name!r} for {task}; "
            f"it reads: {', '.join(accepted) or 'none'}",
            reason="UNKNOWN_OPTION",
            metadata={"option": name, "accepted": ",".join(accepted)},
        )
    try:
        for option in model.adapter.spec.options:
            read = not option.tasks or query.task in option.tasks
            if read and option.check is not None and option.name in query.options:
                option.check(query.options[option.name])
        model.adapter.check(query)
    except AdapterError as error:
        raise InvalidArgument(error.message, reason=error.reason, metadata=error.metadata) from None
    except ValueError as error:
        raise InvalidArgument(f"options: {error}", reason="INVALID_OPTIONS") from None


def _check_task(config: ModelConfig, task: str) -> None:
    if task not in config.tasks:
        raise InvalidArgument(
            f"model {config.id} does not support {task}; it supports: {', '.join(config.tasks)}",
            reason="OPERATION_NOT_SUPPORTED",
            metadata={"model": config.id, "operation": task},
        )


def _check_inputs(config: ModelConfig, items: Sequence[ItemInput]) -> None:
    """Every item's inputs (text, images) must be ones the model takes (its config's `inputs`)."""
    for item in items:
        given = ("text",) * (item.text is not None) + ("image",) * bool(item.images)
        for kind in given:
            if kind not in config.inputs:
                raise InvalidArgument(
                    f"{item.label}: model {config.id} does not take {kind} input; "
                    f"its inputs: {', '.join(config.inputs)}",
                    reason="INPUT_NOT_SUPPORTED",
                    metadata={**item.metadata, "input": kind, "model": config.id},
                )


def _check_text_query(model: LoadedModel, query: ItemInput) -> None:
    """A pair scorer reads its query as a text (each item is scored against it): images there would go unread."""
    if query.images:
        raise InvalidArgument(
            f"query: model {model.config.id} scores each item against a text query and does not read the query's "
            "images; send the query as text (items may hold images)",
            reason="INPUT_NOT_SUPPORTED",
            metadata={**query.metadata, "input": "image", "model": model.config.id},
        )


def _check_one_input_per_item(
    model: LoadedModel, items: Sequence[ItemInput], *, allow_text_with_image: bool = False
) -> None:
    """A dual encoder embeds each item from one text or one image: mixing them in an item has no meaning. An
    extractor reads one image, with a text beside it where the model takes one (a question about the page)."""
    for item in items:
        if len(item.images) > 1 or (item.images and item.text is not None and not allow_text_with_image):
            has = (
                f"{'text and ' if item.text is not None else ''}{len(item.images)} image{'s' * (len(item.images) > 1)}"
            )
            takes = "reads one text, one image, or both" if allow_text_with_image else "embeds one text or one image"
            raise InvalidArgument(
                f"{item.label}: model {model.config.id} {takes} per item; this item has {has}. "
                "Send each input as an item of its own",
                reason="TOO_MANY_ITEM_INPUTS",
                metadata=item.metadata,
            )


def _check_lora(config: ModelConfig, lora: str) -> None:
    if lora and lora not in config.loras:
        raise InvalidArgument(
            f"lora: model {config.id} has no LoRA adapter {lora!r}; "
            f"it has: {', '.join(sorted(config.loras)) or 'none'}",
            reason="LORA_NOT_FOUND",
            metadata={"lora": lora},
        )


def _check_outputs(config: ModelConfig, output_types: tuple[str, ...]) -> None:
    for output in output_types:
        if output not in config.output_types:
            raise InvalidArgument(
                f"model {config.id} does not produce {output!r} output; it produces: {', '.join(config.output_types)}",
                reason="OUTPUT_NOT_SUPPORTED",
                metadata={"output_type": output},
            )
