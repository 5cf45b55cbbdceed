"""At load: whether an adapter serves what its model's config asks of it."""

from __future__ import annotations

from sie_common.cluster.model_config import ModelConfig
from sie_worker.adapters.base import ImageEncoder, ImageExtractor, ItemExtractor, ModelAdapter


def check_adapter_serves(config: ModelConfig, adapter_name: str, adapter: ModelAdapter) -> None:
    """The config's tasks, inputs and output types must be ones its adapter provides (ValueError otherwise)."""
    missing_tasks = [task for task in config.tasks if task not in adapter.tasks]
    if missing_tasks:
        raise ValueError(
            f"tasks: adapter {adapter_name} does not do {', '.join(missing_tasks)}; it does: {', '.join(adapter.tasks)}"
        )
    if "extract" in config.tasks and not isinstance(adapter, ItemExtractor):
        raise ValueError(f"tasks: adapter {adapter_name} does not extract")
    if "image" in config.inputs and not isinstance(adapter, ImageEncoder | ImageExtractor):
        raise ValueError(f"inputs: adapter {adapter_name} does not take images; it takes: text")
    if "encode" not in config.tasks:
        return
    produced = set(adapter.output_types) | ({"dense"} if "multivector" in adapter.output_types else set())
    missing = [output for output in config.output_types if output not in produced]
    if missing:
        raise ValueError(
            f"output_types: adapter {adapter_name} does not produce {', '.join(missing)}; "
            f"it produces: {', '.join(sorted(produced))}"
        )
