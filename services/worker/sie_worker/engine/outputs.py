"""What a loaded model outputs: the outputs its forward pass computes for the ones a request asks for (dense from
MUVERA where the model has multivectors only), MUVERA's parameters and the width of its dense output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sie_common.edge.errors import InvalidArgument
from sie_worker.engine.postprocess import MuveraParams
from sie_worker.models.build import LoadedModel


def device_outputs(model: LoadedModel, output_types: tuple[str, ...]) -> tuple[str, ...]:
    """What the forward pass must produce: dense of a multivector-only model comes from MUVERA."""
    native = model.adapter.spec.outputs
    needed = []
    for output in output_types:
        source = "multivector" if output == "dense" and model.adapter.spec.uses_muvera else output
        if source not in native:
            raise InvalidArgument(
                f"model {model.config.id} (adapter {model.config.profile(model.profile).adapter}) cannot produce "
                f"{output!r}; it produces: {', '.join(native)}",
                reason="OUTPUT_NOT_SUPPORTED",
                metadata={"output_type": output},
            )
        needed.append(source)
    return tuple(dict.fromkeys(needed))


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
    if model.adapter.spec.uses_muvera:
        return muvera_params(model, options).dims
    return model.adapter.dims
