"""The directories a model config may make the worker read weights from.

A config's `path` and its local LoRA directories must lie inside one of
SIE_WEIGHT_ROOTS (default: the local weight cache, SIE_MODELS_DIR and the
built-in models' package directories), after resolving symlinks: a directory
inside a root whose files link out of it is refused too. `bundled_weights`
names a directory inside an installed package; the validator refuses a dotted
package, a subdir with '..' or an absolute one, and only the weight packages
(DEFAULT_WEIGHT_PACKAGES and SIE_WEIGHT_PACKAGES) are looked up at all: no
other module is ever found, let alone imported, for a config.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path

from sie_common.cluster.model_config import ModelConfig, weight_packages
from sie_common.edge.errors import FailedPrecondition
from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import local_cache_root
from sie_worker.weights.s3 import is_s3_url


def default_roots(settings: WorkerSettings, builtin: Iterable[ModelConfig]) -> list[Path]:
    """SIE_WEIGHT_ROOTS, else the local cache, a local SIE_MODELS_DIR and the built-in models' package directories."""
    if settings.weight_roots:
        return [Path(root) for root in settings.weight_roots]
    roots = [local_cache_root(settings)]
    if not is_s3_url(settings.models_dir):
        roots.append(Path(settings.models_dir))
    allowed = weight_packages(settings.weight_packages)
    for config in builtin:
        if config.bundled_weights is None:
            continue
        bundled = bundled_directory(config.bundled_weights, allowed, model=config.id)
        if bundled is not None:
            roots.append(bundled)
    return roots


def is_local_lora(location: str) -> bool:
    """A LoRA source that names a directory rather than a Hugging Face repo id."""
    return Path(location).is_absolute() or Path(location).is_dir()


class WeightPackageNotAllowed(FailedPrecondition):
    """A config names a package that is not one of the weight packages: permanent, never looked up."""

    def __init__(self, package: str, allowed: frozenset[str], *, model: str) -> None:
        super().__init__(
            f"bundled_weights of {model} names package {package!r}, which is not a weight package of this worker "
            f"({', '.join(sorted(allowed))}); add it to SIE_WEIGHT_PACKAGES to allow it",
            reason="WEIGHT_PACKAGE_NOT_ALLOWED",
            metadata={"model": model, "package": package},
        )


def bundled_directory(spec: str, allowed: frozenset[str], *, model: str) -> Path | None:
    """The directory `package:subdir` names, when the package is installed; WeightPackageNotAllowed unless the
    package is in `allowed` (a top-level name: finding it imports nothing)."""
    package, _, subdir = spec.partition(":")
    if package not in allowed or "." in package:
        raise WeightPackageNotAllowed(package, allowed, model=model)
    found = importlib.util.find_spec(package)
    if found is None or found.origin is None:
        return None
    directory = Path(found.origin).parent / subdir
    return directory if directory.is_dir() else None


class WeightsOutsideRoots(FailedPrecondition):
    """A config points the worker at files outside the allowed weight roots."""

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message, reason="WEIGHTS_OUTSIDE_ROOTS", metadata={"model": model})


class WeightRoots:
    def __init__(self, roots: Iterable[Path]) -> None:
        self.roots = tuple(dict.fromkeys(Path(os.path.realpath(root)) for root in roots))

    def describe(self) -> str:
        return ", ".join(str(root) for root in self.roots) or "none"

    def check(self, path: Path, *, model: str, what: str) -> None:
        """Raise WeightsOutsideRoots unless `path` and everything under it resolve inside a root."""
        where = f"{what} {str(path)!r} of {model}"
        if ".." in path.parts:
            raise WeightsOutsideRoots(f"{where} contains '..'; name the directory without it", model=model)
        real = Path(os.path.realpath(path))
        if not self._inside(real):
            raise WeightsOutsideRoots(
                f"{where} is outside the allowed weight roots ({self.describe()}); add its directory to "
                f"SIE_WEIGHT_ROOTS",
                model=model,
            )
        if real.is_dir():
            for entry in real.rglob("*"):
                if entry.is_symlink() and not self._inside(Path(os.path.realpath(entry))):
                    raise WeightsOutsideRoots(
                        f"{where}: {entry.relative_to(real)} links to {os.path.realpath(entry)}, outside the allowed "
                        f"weight roots ({self.describe()})",
                        model=model,
                    )

    def check_config(self, config: ModelConfig) -> None:
        """Every local directory `config` names: its path and local LoRA directories."""
        if config.path is not None:
            self.check(config.path, model=config.id, what="path")
        for name, location in config.loras.items():
            if is_local_lora(location):
                self.check(Path(location), model=config.id, what=f"loras.{name}")

    def _inside(self, real: Path) -> bool:
        return any(real == root or root in real.parents for root in self.roots)
