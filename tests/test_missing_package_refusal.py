"""A model whose family needs a package the worker lacks: the adapter raises MissingPackage as it loads (an adapter
error, not a caller-facing status), and the registry answers every request for it FAILED_PRECONDITION
ADAPTER_DEPENDENCY_MISSING, naming the model, the missing module and how to install it, without loading again."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from sie_common.cluster.bundles import Bundle
from sie_common.cluster.model_config import parse_model_config
from sie_common.edge.errors import FailedPrecondition
from sie_worker.adapters.contract import Adapter, Input, LoadContext, MissingPackage, Prepared, Query
from sie_worker.adapters.layers.optional_packages import require_package
from sie_worker.adapters.spec import AdapterSpec
from sie_worker.models.catalog import Catalog
from sie_worker.models.registry import ModelRegistry, ModelState
from sie_worker.settings import WorkerSettings
from sie_worker.weights.roots import WeightRoots

MODEL = "fake/needs-package"
PACKAGE = "sie_test_package_nobody_installs"
INSTALL = "pip install sie-test-package"


class NeedsPackage(Adapter):
    """A family built on a package no environment has."""

    spec = AdapterSpec("needs_package", tasks=("extract",))
    builds = 0

    def __init__(self, context: LoadContext) -> None:
        NeedsPackage.builds += 1
        require_package(PACKAGE, context.config.id, INSTALL)

    def prepare_one(self, item: Input, query: Query) -> Prepared:
        raise AssertionError("never loaded")

    def run(self, batch: Sequence[Any], query: Query) -> list[Any]:
        raise AssertionError("never loaded")

    def finish(self, item: Input, prepared: Any, output: Any, query: Query) -> Any:
        raise AssertionError("never loaded")


def registry_of(directory: Path) -> ModelRegistry:
    weights = directory / "weights"
    weights.mkdir()
    profiles = {"default": {"adapter": "needs_package"}}
    config = parse_model_config(
        {"id": MODEL, "path": str(weights), "tasks": ["extract"], "profiles": profiles}, source=MODEL
    )
    settings = WorkerSettings(models_dir=str(directory / "no-configs"), weight_roots=(str(directory),))
    catalog = Catalog(Bundle("needs", ("needs_package",)), {MODEL: config}, weight_roots=WeightRoots([directory]))
    return ModelRegistry(catalog, settings, torch.device("cpu"), {"needs_package": NeedsPackage})


async def test_a_missing_package_is_failed_precondition_for_every_request_and_never_loaded_again(
    tmp_path: Path,
) -> None:
    registry = registry_of(tmp_path)
    with pytest.raises(MissingPackage) as missing:
        await registry.load(MODEL)
    assert missing.value.metadata == {"model": MODEL, "package": PACKAGE}
    for _ in range(2):
        with pytest.raises(FailedPrecondition) as refused, registry.use(MODEL):
            pass
        error = refused.value
        assert error.reason == "ADAPTER_DEPENDENCY_MISSING"
        assert error.metadata == {"model": MODEL, "package": PACKAGE}
        assert f"missing module {PACKAGE!r}" in error.message and INSTALL in error.message
    failure = registry.failure(MODEL)
    assert failure is not None and failure.permanent and failure.attempts == 1
    assert failure.error == missing.value.message  # ListModels' failure says it as the refusal does
    assert registry.state(MODEL) is ModelState.FAILED
    assert NeedsPackage.builds == 1
