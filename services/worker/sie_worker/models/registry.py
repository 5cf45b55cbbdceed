"""The models this worker serves, and their lifecycle in memory.

    available -> loading -> loaded -> unloading -> available
                        \\-> failed (permanent, or retried after a cool-down)

Requests never wait on a load: a model that is not loaded starts loading and
the request gets UNAVAILABLE (reason MODEL_LOADING) with a retry delay.
SIE_PRELOAD_MODELS loads models before the worker reports SERVING. Loaded
models live in an LRU: before a load, and from a background monitor, the
least recently used idle model is evicted while memory is over the
threshold; SIE_IDLE_EVICT_S evicts models nobody used for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import NoReturn

import torch

from sie_common.cluster.config_store import is_from_etcd
from sie_common.cluster.model_config import DEFAULT_PROFILE, ModelConfig
from sie_common.edge.errors import FailedPrecondition, NotFound, Unavailable, clipped, some_of
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.contract import Adapter
from sie_worker.models.build import LoadedModel, ModelBuilder, ModelStats
from sie_worker.models.catalog import Catalog
from sie_worker.models.load_errors import (
    FAILURE_CHARS,
    MAX_COOLDOWN_S,
    LoadFailure,
    describe_failure,
    is_permanent,
    refusal_of,
)
from sie_worker.models.memory import Key, MemoryPressure, ResidentModels, weight_file_bytes
from sie_worker.models.passing_thread import in_passing_thread
from sie_worker.settings import WorkerSettings
from sie_worker.weights.resolver import ResolvedWeights, WeightResolver

log = logging.getLogger(__name__)

# Retry delay suggested to a caller while a model loads whose load time is not known yet.
FIRST_LOAD_RETRY_S = 1.0


class ModelState(enum.Enum):
    AVAILABLE = enum.auto()
    LOADING = enum.auto()
    LOADED = enum.auto()
    UNLOADING = enum.auto()
    FAILED = enum.auto()


class ModelRegistry:
    """The served models (the catalog's configs, and those the control plane adds) and the load state machine."""

    def __init__(
        self,
        catalog: Catalog,
        settings: WorkerSettings,
        device: torch.device,
        adapters: Mapping[str, type[Adapter]] = ADAPTERS,
    ) -> None:
        """`adapters`: the adapter of each name a profile may give (every family of sie_worker.adapters by default)."""
        self._catalog = catalog
        self._configs = catalog.configs
        self._settings = settings
        self._device = device
        self._weights = WeightResolver(settings, catalog.weight_roots)
        self._builder = ModelBuilder(settings, device, catalog.weight_roots, adapters)
        self._resident: ResidentModels[LoadedModel] = ResidentModels(MemoryPressure(device, settings), settings)
        self._loaded = self._resident.loaded
        self._unloading = self._resident.unloading
        self._loading: dict[Key, asyncio.Task[LoadedModel]] = {}
        self._failures: dict[Key, LoadFailure] = {}
        self._load_seconds: dict[str, float] = {}
        self._stats: dict[str, ModelStats] = {model: ModelStats() for model in self._configs}

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

    def serves(self, model_id: str) -> bool:
        """Whether a config of this worker names the model (what a metric's `model` label may say)."""
        return model_id in self._configs

    def serves_profile(self, profile: str) -> bool:
        """Whether a served model has a profile of this name (what a metric's `profile` label may say)."""
        return any(profile in config.profiles for config in list(self._configs.values()))

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    def config(self, model_id: str) -> ModelConfig:
        """The config of a served model, or NOT_FOUND naming the ones that are."""
        config = self._configs.get(model_id)
        if config is None:
            problem = self._catalog.excluded.get(model_id) or "it is not served here"
            raise NotFound(
                f"model {model_id!r}: {problem}; available: {some_of(self._configs)}",
                reason="MODEL_NOT_FOUND",
                metadata={"model": model_id},
            )
        return config

    def _key(self, model_id: str, profile: str) -> Key:
        config = self.config(model_id)
        profile = profile or DEFAULT_PROFILE
        if profile not in config.profiles:
            raise NotFound(
                f"model {model_id!r} has no profile {profile!r}; profiles: {', '.join(sorted(config.profiles))}",
                reason="PROFILE_NOT_FOUND",
                metadata={"model": model_id, "profile": profile},
            )
        return (model_id, profile)

    @contextlib.contextmanager
    def use(self, model_id: str, profile: str = "") -> Iterator[LoadedModel]:
        """Hold a loaded model for one request; starts a load and answers UNAVAILABLE when it is not loaded."""
        key = self._key(model_id, profile)
        loaded = self._loaded.get(key)
        if loaded is None:
            self._refuse_until_loaded(key)
        loaded.active += 1
        loaded.last_used = time.monotonic()
        try:
            yield loaded
        finally:
            loaded.active -= 1
            loaded.last_used = time.monotonic()

    def _refuse_until_loaded(self, key: Key) -> NoReturn:
        model_id, profile = key
        failure = self._failures.get(key)
        if failure is not None and failure.refusal is not None:
            refusal = failure.refusal
            raise FailedPrecondition(
                clipped(refusal.message, FAILURE_CHARS), reason=refusal.reason, metadata=refusal.metadata
            )
        if failure is not None and failure.permanent:
            raise FailedPrecondition(
                f"model {model_id!r} cannot be loaded: {failure.error}. Fix the cause and restart the worker.",
                reason="MODEL_LOAD_FAILED",
                metadata={"model": model_id, "attempts": str(failure.attempts)},
            )
        if failure is not None and key not in self._loading and failure.retry_in_s() > 0:
            raise Unavailable(
                f"model {model_id!r} failed to load (failures in a row: {failure.attempts}): {failure.error}; "
                f"next attempt in {failure.retry_in_s():.0f} s",
                reason="MODEL_LOAD_BACKOFF",
                retry_after_s=failure.retry_in_s(),
                metadata={"model": model_id, "attempts": str(failure.attempts)},
            )
        self._start_load(key)
        raise Unavailable(
            f"model {model_id!r} (profile {profile}) is loading; retry shortly",
            reason="MODEL_LOADING",
            retry_after_s=self._load_seconds.get(model_id, FIRST_LOAD_RETRY_S),
            metadata={"model": model_id},
        )

    def _start_load(self, key: Key) -> asyncio.Task[LoadedModel]:
        task = self._loading.get(key)
        if task is None:
            task = asyncio.create_task(self._load(key), name=f"load {key[0]}")
            # A lazy load's failure is recorded and logged by _load; nobody else awaits it.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._loading[key] = task
        return task

    async def load(self, model_id: str, profile: str = "") -> LoadedModel:
        """Load now and wait (SIE_PRELOAD_MODELS); raises what the load raised."""
        key = self._key(model_id, profile)
        if key in self._loaded:
            return self._loaded[key]
        return await asyncio.shield(self._start_load(key))

    async def _load(self, key: Key) -> LoadedModel:
        model_id, profile = key
        config = self._configs[model_id]
        started = time.perf_counter()
        try:
            if key in self._unloading:
                await self._unloading[key]
            self._check_remote_code(config, profile)
            keep = frozenset(model.weights_key for model in self._loaded.values())
            weights = await asyncio.to_thread(self._weights.resolve, config, keep=keep)
            await self._resident.make_room(await asyncio.to_thread(weight_file_bytes, weights.path))
            loaded = await in_passing_thread(self._build, config, profile, weights)
        except Exception as error:
            self._record_failure(key, error)
            raise
        finally:
            self._loading.pop(key, None)
        self._failures.pop(key, None)
        self._loaded[key] = loaded
        seconds = time.perf_counter() - started
        self._load_seconds[model_id] = max(FIRST_LOAD_RETRY_S, seconds)
        log.info(
            "loaded %s (profile %s) from %s in %.1f s: %.1f MiB",
            model_id,
            profile,
            weights.source,
            seconds,
            loaded.memory_bytes / 2**20,
        )
        return loaded

    def _check_remote_code(self, config: ModelConfig, profile: str) -> None:
        """A config from the control plane may run code shipped with its weights only if this worker allows it."""
        if is_from_etcd(config) and config.profile(profile).trust_remote_code and not self._settings.allow_remote_code:
            raise FailedPrecondition(
                f"model {config.id!r} (profile {profile}) sets trust_remote_code, and this worker does not run code "
                f"from"
                " configs added through the config service; set SIE_ALLOW_REMOTE_CODE=true on the worker to allow it",
                reason="REMOTE_CODE_DISABLED",
                metadata={"model": config.id},
            )

    def _build(self, config: ModelConfig, profile: str, weights: ResolvedWeights) -> LoadedModel:
        return self._builder.build(config, profile, weights, self._stats[config.id])

    def _record_failure(self, key: Key, error: Exception) -> None:
        previous = self._failures.get(key)
        attempts = (previous.attempts if previous else 0) + 1
        permanent = is_permanent(error)
        cooldown = min(MAX_COOLDOWN_S, self._settings.load_retry_cooldown_s * 2 ** (attempts - 1))
        refusal = refusal_of(error)
        described = describe_failure(error)
        self._failures[key] = LoadFailure(
            clipped(described, FAILURE_CHARS), attempts, permanent, time.monotonic() + cooldown, refusal
        )
        log.error(
            "loading %s (profile %s) failed (attempt %d, %s): %s",
            key[0],
            key[1],
            attempts,
            "permanent" if permanent else f"retry after {cooldown:.0f} s",
            described,
        )

    @property
    def pressure(self) -> MemoryPressure:
        return self._resident.pressure

    @property
    def loaded_bytes(self) -> int:
        return self._resident.loaded_bytes

    async def monitor(self) -> None:
        """Background: evict idle models (SIE_IDLE_EVICT_S) and LRU models under memory pressure."""
        await self._resident.monitor()

    async def check_memory(self) -> None:
        await self._resident.check_memory()

    def state(self, model_id: str) -> ModelState:
        keys = [key for key in (*self._loaded, *self._loading, *self._unloading, *self._failures) if key[0] == model_id]
        if any(key in self._loaded for key in keys):
            return ModelState.LOADED
        if any(key in self._loading for key in keys):
            return ModelState.LOADING
        if any(key in self._unloading for key in keys):
            return ModelState.UNLOADING
        if any(key in self._failures for key in keys):
            return ModelState.FAILED
        return ModelState.AVAILABLE

    def loaded(self, model_id: str) -> list[LoadedModel]:
        """The model's loaded profiles."""
        return [model for (model_id_, _), model in self._loaded.items() if model_id_ == model_id]

    def stats(self, model_id: str) -> ModelStats:
        return self._stats[model_id]

    def failure(self, model_id: str) -> LoadFailure | None:
        """The last load failure of one of the model's profiles, if any."""
        return next((failure for (model_id_, _), failure in self._failures.items() if model_id_ == model_id), None)
