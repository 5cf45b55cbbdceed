"""A served model as ListModels and DescribeModel describe it: its config, and what loading it showed."""

from __future__ import annotations

from dataclasses import dataclass

from sie_common.cluster.model_config import ModelConfig
from sie_worker.engine.outputs import dense_dims
from sie_worker.models.build import ModelStats
from sie_worker.models.load_errors import LoadFailure
from sie_worker.models.registry import ModelRegistry, ModelState


@dataclass(frozen=True)
class ModelDescription:
    config: ModelConfig
    state: ModelState
    stats: ModelStats
    # The config's dims, else (loaded) the model's dense width, MUVERA's for a multivector model; 0 when unknown.
    dims: int
    # Loaded, what the model really reads (a config's value is capped at its position table); else the config's.
    max_sequence_length: int
    memory_bytes: int
    loaded_loras: list[str]
    # The last load failure, while the model is in the failed state.
    failure: LoadFailure | None


def describe(registry: ModelRegistry, model_id: str) -> ModelDescription:
    """NOT_FOUND if the model is not served."""
    config = registry.config(model_id)
    loaded = registry.loaded(model_id)
    state = registry.state(model_id)
    return ModelDescription(
        config=config,
        state=state,
        stats=registry.stats(model_id),
        dims=config.dims or (dense_dims(loaded[0], {}) if loaded else 0),
        max_sequence_length=loaded[0].adapter.max_sequence_length if loaded else config.max_sequence_length or 0,
        memory_bytes=sum(model.memory_bytes for model in loaded),
        loaded_loras=loaded[0].loras.loaded if loaded else [],
        failure=registry.failure(model_id) if state is ModelState.FAILED else None,
    )
