"""A request's plan: the model that serves it and what it computes, looked up and checked once per request.

`plan` is where a job meets its model: every per-model check (task, inputs, LoRA, output types, dims, MUVERA,
score options, labels) answers here, with the INVALID_ARGUMENT (or NOT_FOUND, UNAVAILABLE) its caller is told.
The pipeline runs the plan and asks the model nothing more.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from sie_common.cluster.model_config import ModelConfig
from sie_common.edge.answer_size import MAX_SEND_SETTING, check_dense_estimate
from sie_common.edge.errors import InvalidArgument
from sie_worker.adapters.base import (
    EncodedItem,
    ExtractQuery,
    ImageEncoder,
    ItemExtractor,
    OptionScorer,
    PairScorer,
)
from sie_worker.engine.jobs import EncodeJob, ExtractJob, ItemInput, ScoreJob
from sie_worker.engine.limits import Limits, check_muvera
from sie_worker.engine.postprocess import MuveraParams, cosine, maxsim
from sie_worker.models.build import LoadedModel
from sie_worker.models.registry import ModelRegistry

Similarity = Callable[[EncodedItem, EncodedItem], float]
Job = EncodeJob | ScoreJob | ExtractJob


@dataclass(frozen=True)
class RequestPlan:
    """What one request runs, on which model."""

    model: LoadedModel
    task: str  # "encode", "score" or "extract"
    # Encode: the outputs the answer carries (the model's default when the job names none).
    outputs: tuple[str, ...] = ()
    # What the forward pass computes: for encode, `outputs` with dense from multivectors where MUVERA makes it;
    # for a score by embeddings, the outputs its similarity compares.
    device_outputs: tuple[str, ...] = ()
    # Encode: MUVERA's parameters when dense comes from multivectors.
    muvera: MuveraParams | None = None
    # Encode: the width dense vectors are cut to (None: the model's), and the dtype the answer's vectors take.
    dims: int | None = None
    output_dtype: str = "float32"
    # Score: how a query's and an item's embeddings compare; None where the model scores pairs itself.
    similarity: Similarity | None = None

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
        self._check_answer_estimate(job, outputs, config.dims)  # before loading: with the dims the config states
        model = self._model(holds, config, job.profile, "encode", job.lora, job.items)
        needed = _device_outputs(model, outputs)
        muvera = _muvera_params(model, job.options) if "dense" in outputs and _uses_muvera(model) else None
        if muvera is not None:
            check_muvera(muvera, self.limits)
        if job.dims is not None and "dense" in outputs and job.dims > dense_dims(model, job.options):
            raise InvalidArgument(
                f"dims {job.dims} exceeds the {dense_dims(model, job.options)} dimensions of {job.model}",
                reason="DIMS_TOO_LARGE",
                metadata={"dims": str(job.dims)},
            )
        self._check_answer_estimate(job, outputs, dense_dims(model, job.options))
        _check_one_input_per_item(model, job.items)
        return RequestPlan(model, "encode", outputs, needed, muvera, job.dims, job.output_dtype)

    def _check_answer_estimate(self, job: EncodeJob, outputs: tuple[str, ...], model_dims: int | None) -> None:
        """RESPONSE_TOO_LARGE before any work when the job's dense vectors alone could not be sent."""
        if "dense" in outputs:
            # a lower bound: job.dims alone says nothing where the model's own dims are not known yet
            # (dims 2**31-1 read as an 8 GB answer, RESOURCE_EXHAUSTED, where DIMS_TOO_LARGE is the answer)
            dims = min(job.dims or model_dims, model_dims) if model_dims else 0
            check_dense_estimate(len(job.items), dims, job.output_dtype, self.max_send_bytes, MAX_SEND_SETTING)

    def _score(self, job: ScoreJob, holds: contextlib.ExitStack) -> RequestPlan:
        config = self.registry.config(job.model)
        model = self._model(holds, config, job.profile, "score", job.lora, [job.query, *job.items])
        encoder = model.adapter
        if isinstance(encoder, PairScorer):
            return RequestPlan(model, "score")
        outputs: tuple[str, ...]
        similarity: Similarity
        if isinstance(encoder, ImageEncoder) and "dense" in encoder.output_types:  # a dual encoder (CLIP)
            outputs, similarity = ("dense",), lambda query, item: cosine(query.vector("dense"), item.vector("dense"))
        elif isinstance(encoder, OptionScorer):
            try:
                outputs, similarity = encoder.scoring(job.options)
            except ValueError as error:
                raise InvalidArgument(f"options: {error}", reason="INVALID_OPTIONS") from None
        else:
            outputs, similarity = (
                ("multivector",),
                lambda query, item: maxsim(query.vector("multivector"), item.vector("multivector")),
            )
        _check_one_input_per_item(model, [job.query])
        _check_one_input_per_item(model, job.items)
        return RequestPlan(model, "score", device_outputs=outputs, similarity=similarity)

    def _extract(self, job: ExtractJob, holds: contextlib.ExitStack) -> RequestPlan:
        config = self.registry.config(job.model)
        model = self._model(holds, config, job.profile, "extract", job.lora, job.items)
        extractor = model.adapter
        assert isinstance(extractor, ItemExtractor)  # check_adapter_serves: an extract model's adapter is one
        if extractor.zero_shot and not job.labels:
            raise InvalidArgument(
                f"labels: model {job.model} extracts zero-shot and needs at least one label", reason="NO_LABELS"
            )
        try:
            extractor.check_query(ExtractQuery(job.labels, job.threshold, job.options))
        except ValueError as error:
            raise InvalidArgument(f"options: {error}", reason="INVALID_OPTIONS") from None
        _check_one_input_per_item(model, job.items, allow_text_with_image=True)
        return RequestPlan(model, "extract")

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


def _device_outputs(model: LoadedModel, output_types: tuple[str, ...]) -> tuple[str, ...]:
    """What the forward pass must produce: dense of a multivector-only model comes from MUVERA."""
    native = model.adapter.output_types
    needed = []
    for output in output_types:
        source = "multivector" if output == "dense" and "dense" not in native and "multivector" in native else output
        if source not in native:
            raise InvalidArgument(
                f"model {model.config.id} (adapter {model.config.profile(model.profile).adapter}) cannot produce "
                f"{output!r}; it produces: {', '.join(native)}",
                reason="OUTPUT_NOT_SUPPORTED",
                metadata={"output_type": output},
            )
        needed.append(source)
    return tuple(dict.fromkeys(needed))


def _uses_muvera(model: LoadedModel) -> bool:
    """Whether the model's dense output is the MUVERA encoding of its multivectors."""
    native = model.adapter.output_types
    return "dense" not in native and "multivector" in native


def _muvera_params(model: LoadedModel, options: Mapping[str, Any]) -> MuveraParams:
    """MUVERA parameters: the profile's run_options `muvera`, overridden key by key by the request's."""
    configured = model.config.profile(model.profile).run_options.get("muvera") or {}
    requested = options.get("muvera") or {}
    if not isinstance(requested, Mapping):
        raise InvalidArgument("options.muvera must be a mapping of MUVERA parameters", reason="INVALID_OPTIONS")
    try:
        return MuveraParams.from_options({**configured, **requested})
    except ValueError as error:
        raise InvalidArgument(f"options: {error}", reason="INVALID_OPTIONS") from None


def dense_dims(model: LoadedModel, options: Mapping[str, Any]) -> int:
    """Width of the model's dense output (its MUVERA encoding for a multivector model)."""
    if _uses_muvera(model):
        return _muvera_params(model, options).dims
    return model.adapter.dims
