"""What a model can do, and the INVALID_ARGUMENT answers for asking it something else."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sie_common.errors import InvalidArgument
from sie_common.model_config import ModelConfig
from sie_worker.postprocess import MuveraParams

if TYPE_CHECKING:
    from sie_worker.adapters.base import ModelAdapter
    from sie_worker.registry import LoadedModel


def check_adapter_serves(config: ModelConfig, adapter_name: str, adapter: ModelAdapter) -> None:
    """At load: the config's tasks and output types must be ones its adapter provides (ValueError otherwise)."""
    missing_tasks = [task for task in config.tasks if task not in adapter.tasks]
    if missing_tasks:
        raise ValueError(
            f"tasks: adapter {adapter_name} does not do {', '.join(missing_tasks)}; it does: {', '.join(adapter.tasks)}"
        )
    if "encode" not in config.tasks:
        return
    produced = set(adapter.output_types) | ({"dense"} if "multivector" in adapter.output_types else set())
    missing = [output for output in config.output_types if output not in produced]
    if missing:
        raise ValueError(
            f"output_types: adapter {adapter_name} does not produce {', '.join(missing)}; it produces: {', '.join(sorted(produced))}"
        )


def check_task(config: ModelConfig, task: str) -> None:
    if task not in config.tasks:
        raise InvalidArgument(
            f"model {config.id} does not support {task}; it supports: {', '.join(config.tasks)}",
            reason="OPERATION_NOT_SUPPORTED",
            metadata={"model": config.id, "operation": task},
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
