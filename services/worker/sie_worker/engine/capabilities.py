"""What a model can do, and the INVALID_ARGUMENT answers for asking it something else."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sie_common.cluster.model_config import ModelConfig
from sie_common.edge.errors import InvalidArgument

from sie_worker.engine.jobs import ItemInput
from sie_worker.engine.postprocess import MuveraParams
from sie_worker.models.registry import LoadedModel


def check_task(config: ModelConfig, task: str) -> None:
    if task not in config.tasks:
        raise InvalidArgument(
            f"model {config.id} does not support {task}; it supports: {', '.join(config.tasks)}",
            reason="OPERATION_NOT_SUPPORTED",
            metadata={"model": config.id, "operation": task},
        )


def check_inputs(config: ModelConfig, items: Sequence[ItemInput]) -> None:
    """Every item's inputs (text, images) must be ones the model takes (its config's `inputs`)."""
    for item in items:
        given = ("text",) * (item.text is not None) + ("image",) * bool(item.images)
        for kind in given:
            if kind not in config.inputs:
                raise InvalidArgument(
                    f"{item.label}: model {config.id} does not take {kind} input; its inputs: {', '.join(config.inputs)}",
                    reason="INPUT_NOT_SUPPORTED",
                    metadata={**item.metadata, "input": kind, "model": config.id},
                )


def check_one_input_per_item(model: LoadedModel, items: Sequence[ItemInput]) -> None:
    """A dual encoder embeds each item from one text or one image: mixing them in an item has no meaning."""
    for item in items:
        if len(item.images) > 1 or (item.images and item.text is not None):
            has = f"{'text and ' if item.text is not None else ''}{len(item.images)} image{'s' * (len(item.images) > 1)}"
            raise InvalidArgument(
                f"{item.label}: model {model.config.id} embeds one text or one image per item; this item has {has}. "
                "Send each input as an item of its own",
                reason="TOO_MANY_ITEM_INPUTS",
                metadata=item.metadata,
            )


def check_lora(config: ModelConfig, lora: str) -> None:
    if lora and lora not in config.loras:
        raise InvalidArgument(
            f"lora: model {config.id} has no LoRA adapter {lora!r}; it has: {', '.join(sorted(config.loras)) or 'none'}",
            reason="LORA_NOT_FOUND",
            metadata={"lora": lora},
        )


def check_outputs(config: ModelConfig, output_types: tuple[str, ...]) -> None:
    for output in output_types:
        if output not in config.output_types:
            raise InvalidArgument(
                f"model {config.id} does not produce {output!r} output; it produces: {', '.join(config.output_types)}",
                reason="OUTPUT_NOT_SUPPORTED",
                metadata={"output_type": output},
            )


def device_outputs(model: LoadedModel, output_types: tuple[str, ...]) -> tuple[str, ...]:
    """What the forward pass must produce: dense of a multivector-only model comes from MUVERA."""
    native = model.encoder.output_types
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


def uses_muvera(model: LoadedModel) -> bool:
    native = model.encoder.output_types
    return "dense" not in native and "multivector" in native


def muvera_params(model: LoadedModel, options: Mapping[str, Any]) -> MuveraParams:
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
    if uses_muvera(model):
        return muvera_params(model, options).dims
    return model.encoder.dims
