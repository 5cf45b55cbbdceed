"""Between sie.v1 messages and the engine's own types: requests into jobs, outcomes and models into answers."""

from __future__ import annotations

from sie.v1 import inference_pb2

from sie_worker.engine.plan import dense_dims
from sie_worker.models.registry import ModelRegistry, ModelState

_MODEL_STATES = {state: inference_pb2.ModelState.Value(f"MODEL_STATE_{state.name}") for state in ModelState}


def describe_model(registry: ModelRegistry, model_id: str) -> inference_pb2.Model:
    """A served model as ListModels and DescribeModel answer it (NOT_FOUND if it is not served)."""
    config = registry.config(model_id)
    loaded = registry.loaded(model_id)
    state = registry.state(model_id)
    stats = registry.stats(model_id)
    encoder = loaded[0].encoder if loaded else None
    described = inference_pb2.Model(
        id=config.id,
        tasks=config.tasks,
        output_types=config.output_types,
        dims=config.dims or (dense_dims(loaded[0], {}) if loaded else 0),
        # Loaded, what the model really reads (a config's value is capped at its position table).
        max_sequence_length=encoder.max_sequence_length if encoder else config.max_sequence_length or 0,
        profiles=sorted(config.profiles),
        state=_MODEL_STATES[state],
        stats=inference_pb2.ModelStats(requests=stats.requests, items=stats.items, forward_passes=stats.forward_passes),
        inputs=config.inputs,
        memory_bytes=sum(model.memory_bytes for model in loaded),
        loras=sorted(config.loras),
        loaded_loras=loaded[0].loras.loaded if loaded else [],
    )
    failure = registry.failure(model_id)
    if state is ModelState.FAILED and failure is not None:
        described.failure.CopyFrom(
            inference_pb2.ModelLoadFailure(
                error=failure.error, attempts=failure.attempts, permanent=failure.permanent, retry_in_s=failure.retry_in_s()
            )
        )
    return described
