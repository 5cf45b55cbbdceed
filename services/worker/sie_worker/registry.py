"""The models this worker knows, and the ones it has loaded.

Configs come from the built-in demo configs plus SIE_MODELS_DIR, narrowed by
SIE_MODEL_FILTER. Models load on first use (or at start with
SIE_PRELOAD_MODELS); concurrent first requests share one load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sie.v1 import inference_pb2
from sie_common.errors import FailedPrecondition, NotFound, SieError
from sie_common.model_config import DEFAULT_PROFILE, ModelConfig, load_model_config
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.base import LoadContext, ModelAdapter
from sie_worker.adapters.hf_text import LOAD_LOCK
from sie_worker.batching import BatchLimits
from sie_worker.capabilities import check_adapter_serves, dense_dims
from sie_worker.device import compute_dtype
from sie_worker.lora import LoraAdapters
from sie_worker.settings import WorkerSettings
from sie_worker.weights import resolve_weights

log = logging.getLogger(__name__)

BUILTIN_MODELS_DIR = Path(__file__).parent / "builtin_models"



@dataclass
class ModelStats:
    requests: int = 0
    items: int = 0
    forward_passes: int = 0


@dataclass(eq=False)
class LoadedModel:
    config: ModelConfig
    profile: str
    encoder: ModelAdapter  # the model's adapter, whatever its tasks
    limits: BatchLimits
    stats: ModelStats
    loras: LoraAdapters
    last_used: float = field(default_factory=time.monotonic)


def read_model_configs(settings: WorkerSettings) -> dict[str, ModelConfig]:
    """Built-in configs, then SIE_MODELS_DIR (a later file with the same id wins), filtered."""
    files = sorted(BUILTIN_MODELS_DIR.glob("*.yaml"))
    models_dir = Path(settings.models_dir)
    if models_dir.is_dir():
        files += sorted(models_dir.glob("*.yaml")) + sorted(models_dir.glob("*.yml"))
    configs: dict[str, ModelConfig] = {}
    for path in files:
        config = load_model_config(path)
        configs[config.id] = config
    if settings.model_filter:
        missing = [model for model in settings.model_filter if model not in configs]
        if missing:
            raise ValueError(f"SIE_MODEL_FILTER names unknown model {missing[0]!r}; known: {', '.join(sorted(configs))}")
        configs = {model: configs[model] for model in settings.model_filter}
    return configs


class ModelRegistry:
    def __init__(self, configs: dict[str, ModelConfig], settings: WorkerSettings, device: torch.device) -> None:
        self._configs = configs
        self._settings = settings
        self._device = device
        self._loaded: dict[tuple[str, str], LoadedModel] = {}
        self._loading: dict[tuple[str, str], asyncio.Task[LoadedModel]] = {}
        self._failed: set[str] = set()
        self._stats: dict[str, ModelStats] = {model: ModelStats() for model in configs}

    def add_configs(self, configs: Iterable[ModelConfig]) -> None:
        """Serve these configs from now on: new models, or served models with new profiles."""
        for config in configs:
            self._configs[config.id] = config
            self._stats.setdefault(config.id, ModelStats())

    @property
    def loaded_model_ids(self) -> frozenset[str]:
        return frozenset(model_id for model_id, _ in self._loaded)

    @property
    def model_ids(self) -> list[str]:
        return sorted(self._configs)

    def config(self, model_id: str) -> ModelConfig:
        """The config of a served model, or NOT_FOUND naming the ones that are."""
        config = self._configs.get(model_id)
        if config is None:
            raise NotFound(
                f"model {model_id!r} is not served here; available: {', '.join(self.model_ids)}",
                reason="MODEL_NOT_FOUND",
                metadata={"model": model_id},
            )
        return config

    async def get(self, model_id: str, profile: str = "") -> LoadedModel:
        """The loaded model for (id, profile), loading it first if needed."""
        config = self.config(model_id)
        profile = profile or DEFAULT_PROFILE
        if profile not in config.profiles:
            raise NotFound(
                f"model {model_id!r} has no profile {profile!r}; profiles: {', '.join(sorted(config.profiles))}",
                reason="PROFILE_NOT_FOUND",
                metadata={"model": model_id, "profile": profile},
            )
        key = (model_id, profile)
        loaded = self._loaded.get(key)
        if loaded is None:
            task = self._loading.get(key)
            if task is None:
                task = asyncio.create_task(self._load(config, profile))
                self._loading[key] = task
            loaded = await asyncio.shield(task)
        loaded.last_used = time.monotonic()
        return loaded

    async def _load(self, config: ModelConfig, profile_name: str) -> LoadedModel:
        key = (config.id, profile_name)
        started = time.perf_counter()
        try:
            loaded = await asyncio.to_thread(self._load_serialized, config, profile_name)
        except SieError:
            self._failed.add(config.id)
            raise
        except Exception as error:
            self._failed.add(config.id)
            log.exception("loading %s (profile %s) failed", config.id, profile_name)
            raise FailedPrecondition(
                f"model {config.id!r} could not be loaded: {error}",
                reason="MODEL_LOAD_FAILED",
                metadata={"model": config.id},
            ) from error
        finally:
            self._loading.pop(key, None)
        self._failed.discard(config.id)
        self._loaded[key] = loaded
        log.info("loaded %s (profile %s) in %.1f s", config.id, profile_name, time.perf_counter() - started)
        return loaded

    def _load_serialized(self, config: ModelConfig, profile_name: str) -> LoadedModel:
        with LOAD_LOCK:
            return self._load_blocking(config, profile_name)

    def _load_blocking(self, config: ModelConfig, profile_name: str) -> LoadedModel:
        profile = config.profile(profile_name)
        factory = ADAPTERS.get(profile.adapter or "")
        if factory is None:
            raise ValueError(f"adapter {profile.adapter!r} is not in this worker; available: {', '.join(sorted(ADAPTERS))}")
        weights = resolve_weights(config, local_cache=self._settings.local_cache, hf_fallback=self._settings.hf_fallback)
        precision = profile.compute_precision or self._settings.default_compute_precision
        context = LoadContext(
            config=config,
            profile=profile,
            weights=weights,
            device=self._device,
            dtype=compute_dtype(self._device, precision),
            attention_backend=self._settings.attention_backend,
        )
        limits = BatchLimits(
            max_items=self._settings.max_batch_requests,
            max_tokens=profile.max_batch_tokens or self._settings.max_batch_tokens,
            max_wait_s=self._settings.max_batch_wait_ms / 1000,
        )
        adapter = factory(context)
        check_adapter_serves(config, profile.adapter or "", adapter)
        loras = LoraAdapters(
            config.id,
            adapter.model,
            config.loras,
            capacity=self._settings.max_loras_per_model,
            local_cache=self._settings.local_cache,
            hf_fallback=self._settings.hf_fallback,
        )
        return LoadedModel(config, profile_name, adapter, limits, self._stats[config.id], loras)

    def describe(self, model_id: str) -> inference_pb2.Model:
        config = self.config(model_id)
        loaded = [model for (model_id_, _), model in self._loaded.items() if model_id_ == model_id]
        if loaded:
            state = inference_pb2.MODEL_STATE_LOADED
        elif any(model == model_id for model, _ in self._loading):
            state = inference_pb2.MODEL_STATE_LOADING
        elif model_id in self._failed:
            state = inference_pb2.MODEL_STATE_FAILED
        else:
            state = inference_pb2.MODEL_STATE_AVAILABLE
        stats = self._stats[model_id]
        encoder = loaded[0].encoder if loaded else None
        return inference_pb2.Model(
            id=config.id,
            tasks=config.tasks,
            output_types=config.output_types,
            dims=config.dims or (dense_dims(loaded[0], {}) if loaded else 0),
            max_sequence_length=config.max_sequence_length or (encoder.max_sequence_length if encoder else 0),
            loras=sorted(config.loras),
            loaded_loras=loaded[0].loras.loaded if loaded else [],
            profiles=sorted(config.profiles),
            state=state,
            stats=inference_pb2.ModelStats(requests=stats.requests, items=stats.items, forward_passes=stats.forward_passes),
            inputs=config.inputs,
        )
