"""Which models this worker serves: configs from the built-in directory and
SIE_MODELS_DIR (local or s3://), kept to what SIE_BUNDLE runs, narrowed by
SIE_MODEL_FILTER.

A config file that does not validate is reported (log, ListModels) and left
out; it never stops the worker or the other models.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sie_common.cluster.bundles import Bundle, load_bundles, repository_bundles_dir
from sie_common.cluster.model_config import ModelConfig, ModelConfigError, load_model_config, parse_model_config
from sie_worker.adapters import ADAPTERS
from sie_worker.settings import WorkerSettings
from sie_worker.weights.roots import WeightRoots, WeightsOutsideRoots, default_roots
from sie_worker.weights.s3 import S3Location, S3Store, is_s3_url

log = logging.getLogger(__name__)

BUILTIN_MODELS_DIR = Path(__file__).parents[1] / "builtin_models"


@dataclass(frozen=True)
class ConfigProblem:
    source: str
    message: str


@dataclass
class Catalog:
    bundle: Bundle
    configs: dict[str, ModelConfig] = field(default_factory=dict)
    problems: list[ConfigProblem] = field(default_factory=list)
    # Model id -> why this worker's bundle leaves it out.
    excluded: dict[str, str] = field(default_factory=dict)
    weight_roots: WeightRoots = field(default_factory=lambda: WeightRoots(()))


def read_catalog(settings: WorkerSettings) -> Catalog:
    """Every usable config; problems are collected, never raised (bad settings are)."""
    catalog = Catalog(bundle=select_bundle(settings))
    # SIE_MODELS_DIR files replace built-in configs with the same id, but not each other.
    from_models_dir: dict[str, str] = {}
    builtin: list[ModelConfig] = []
    for origin, loaded in [*_builtin_configs(), *_configs_from(settings)]:
        if isinstance(loaded, ConfigProblem):
            catalog.problems.append(loaded)
            continue
        if origin == "builtin":
            builtin.append(loaded)
        if origin == "models_dir":
            if loaded.id in from_models_dir:
                message = f"{loaded.source}: id: model {loaded.id!r} is already defined in {from_models_dir[loaded.id]}"
                catalog.problems.append(ConfigProblem(loaded.source, message))
                continue
            from_models_dir[loaded.id] = loaded.source
        catalog.configs[loaded.id] = loaded

    catalog.weight_roots = WeightRoots(default_roots(settings, builtin))
    for model_id, config in list(catalog.configs.items()):
        try:
            catalog.weight_roots.check_config(config)
        except WeightsOutsideRoots as error:
            del catalog.configs[model_id]
            catalog.problems.append(ConfigProblem(config.source, f"{config.source}: {error.message}"))

    for model_id, config in list(catalog.configs.items()):
        if not catalog.bundle.can_serve(config):
            del catalog.configs[model_id]
            catalog.excluded[model_id] = (
                f"bundle {catalog.bundle.id!r} (adapters: {', '.join(catalog.bundle.adapters)}) does not serve it"
                f" (adapter {config.profile().adapter!r})"
            )
    if settings.model_filter:
        # Reported, not fatal: the model's file may be the one that failed to validate.
        known = ", ".join(sorted(catalog.configs))
        for model in settings.model_filter:
            if model not in catalog.configs:
                message = f"SIE_MODEL_FILTER names model {model!r}, which has no usable config here; known: {known}"
                catalog.problems.append(ConfigProblem("SIE_MODEL_FILTER", message))
        catalog.configs = {model: catalog.configs[model] for model in settings.model_filter if model in catalog.configs}

    for problem in catalog.problems:
        log.error("model config skipped: %s", problem.message)
    for model_id, why in catalog.excluded.items():
        log.info("model %s not served: %s", model_id, why)
    return catalog


def select_bundle(settings: WorkerSettings) -> Bundle:
    """SIE_BUNDLE from SIE_BUNDLES_DIR.

    Without a definition there, a worker that follows the config service (etcd
    holds its bundle), or an installed worker with no bundles directory asking
    for `default`, serves local configs for every adapter it has."""
    directory = Path(settings.bundles_dir) if settings.bundles_dir else repository_bundles_dir()
    bundles = load_bundles(directory) if directory is not None and directory.is_dir() else {}
    if settings.bundle in bundles:
        return bundles[settings.bundle]
    if settings.etcd_endpoints or (settings.bundle == "default" and not settings.bundles_dir and not bundles):
        return Bundle(settings.bundle, tuple(sorted(ADAPTERS)))
    if directory is None:
        raise ValueError(
            f"SIE_BUNDLE={settings.bundle!r} is not a bundle: SIE_BUNDLES_DIR is not set, and there is no "
            "repository bundles/ beside an installed worker"
        )
    raise ValueError(
        f"SIE_BUNDLE={settings.bundle!r} is not a bundle in {directory}; bundles: "
        f"{', '.join(sorted(bundles)) or 'none'}"
    )


Loaded = tuple[str, ModelConfig | ConfigProblem]


def _builtin_configs() -> Iterator[Loaded]:
    for path in sorted(BUILTIN_MODELS_DIR.glob("*.yaml")):
        yield "builtin", _load_file(path)


def _configs_from(settings: WorkerSettings) -> Iterator[Loaded]:
    location = settings.models_dir
    if is_s3_url(location):
        yield from _configs_from_s3(S3Location.parse(location), settings.s3_endpoint_url)
        return
    directory = Path(location)
    if directory.is_dir():
        for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
            yield "models_dir", _load_file(path)


def _configs_from_s3(location: S3Location, endpoint_url: str | None) -> Iterator[Loaded]:
    store = S3Store(endpoint_url)
    try:
        keys = [key for key in store.keys(location) if key.endswith((".yaml", ".yml"))]
    except Exception as error:  # noqa: BLE001 - botocore's many error types: report and serve the rest
        yield "models_dir", ConfigProblem(str(location), f"{location}: cannot list model configs: {error}")
        return
    for key in keys:
        source = f"s3://{location.bucket}/{key}"
        try:
            data = yaml.safe_load(store.read_text(location.bucket, key))
            yield "models_dir", parse_model_config(data, source=source)
        except yaml.YAMLError as error:
            yield "models_dir", ConfigProblem(source, f"{source}: not valid YAML: {error}")
        except ModelConfigError as error:
            yield "models_dir", ConfigProblem(source, str(error))
        except Exception as error:  # noqa: BLE001 - an unreadable file is reported; the other configs still serve
            yield "models_dir", ConfigProblem(source, f"{source}: cannot read: {error}")


def _load_file(path: Path) -> ModelConfig | ConfigProblem:
    try:
        return load_model_config(path)
    except ModelConfigError as error:
        return ConfigProblem(str(path), str(error))
    except (OSError, UnicodeDecodeError) as error:
        return ConfigProblem(str(path), f"{path}: cannot read: {error}")
