"""What adapters built on optional packages share: the check that the package is there, and the checks on the
code a package would run from a checkpoint's saved configs."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

from sie_worker.adapters.contract import MissingPackage


def require_package(package: str, model_id: str, install: str) -> None:
    """MissingPackage, saying what to install, when `package` or a module it imports is missing.

    `install`: the commands that install it, e.g. "pip install '.[gliclass]'"."""
    try:
        importlib.import_module(package)
    except ModuleNotFoundError as missing:
        module = missing.name or package
        raise MissingPackage(
            f"model {model_id} needs the {package!r} package, which cannot be imported in this worker (missing module "
            f"{module!r}); install the engine's {package} extra ({install}, see docs/models.md) or serve the model "
            "from a worker image that has it",
            model=model_id,
            package=module,
        ) from None


def auto_map_in(config: Any, where: str = "") -> str | None:
    """Where in a saved config (dotted keys) an `auto_map` names code, if anywhere."""
    if isinstance(config, dict):
        if config.get("auto_map") and where:
            return where
        for key, value in config.items():
            found = auto_map_in(value, f"{where}.{key}" if where else str(key))
            if found is not None:
                return found
    return None


def config_without_shipped_code(path: Path) -> dict[str, Any]:
    """The saved JSON config at `path`; ValueError when it names code shipped with the weights (auto_map)."""
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    shipped = auto_map_in(config)
    if shipped is not None:
        raise ValueError(
            f"{path}: {shipped} names code shipped with the weights (auto_map); set load_options.trust_remote_code: "
            "true to run it"
        )
    return config


def is_local_path(name: str) -> bool:
    """Whether transformers would read `name` as a local directory rather than a Hub id."""
    return os.path.isabs(name) or name.startswith((".", "~")) or os.path.isdir(name)
