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
import errno
import gc
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError

from sie_common.cluster.config_store import is_from_etcd
from sie_common.cluster.model_config import DEFAULT_PROFILE, ModelConfig, ModelConfigError
from sie_common.edge.errors import FailedPrecondition, NotFound, Unavailable, clipped, some_of
from sie_worker.adapters import ADAPTERS
from sie_worker.adapters.base import LoadContext, ModelAdapter
from sie_worker.adapters.hf_text import LOAD_LOCK
from sie_worker.models.catalog import Catalog
from sie_worker.models.cpu_precision import cpu_flags, load_on_cpu
from sie_worker.models.device import compute_dtype
from sie_worker.models.lora import LoraAdapters
from sie_worker.models.memory import MemoryPressure, module_bytes, release_cuda_cache, weight_file_bytes
from sie_worker.models.passing_thread import in_passing_thread
from sie_worker.models.serves import check_adapter_serves
from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import weights_key
from sie_worker.weights.resolver import ResolvedWeights, WeightResolver, WeightsNotFound

log = logging.getLogger(__name__)

# Retry delay suggested to a caller while a model loads whose load time is not known yet.
FIRST_LOAD_RETRY_S = 1.0
# Cool-downs after retryable failures double up to this.
MAX_COOLDOWN_S = 300.0
# Characters of a load failure's cause that callers see (the log has it whole): errors travel in gRPC trailers,
# which a caller refuses past 8 KiB, and a cause can be any size (a config value, every key of a checkpoint).
FAILURE_CHARS = 1024

Key = tuple[str, str]  # (model id, profile)


class ModelState(enum.Enum):
    AVAILABLE = enum.auto()
    LOADING = enum.auto()
    LOADED = enum.auto()
    UNLOADING = enum.auto()
    FAILED = enum.auto()


@dataclass
class ModelStats:
    requests: int = 0
    items: int = 0
    forward_passes: int = 0


@dataclass
class LoadFailure:
    error: str
    attempts: int
    permanent: bool
    retry_at: float  # time.monotonic() after which a request may try again
    # A precise refusal the load raised itself (e.g. the adapter lacks a configured output): answered as is.
    refusal: FailedPrecondition | None = None

    def retry_in_s(self) -> float:
        return 0.0 if self.permanent else max(0.0, self.retry_at - time.monotonic())


@dataclass(eq=False)
class LoadedModel:
    config: ModelConfig
    profile: str
    encoder: ModelAdapter  # the model's adapter, whatever its tasks
    stats: ModelStats
    loras: LoraAdapters
    weights_key: str = ""
    memory_bytes: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # Requests holding the model; a model in use is never evicted.
    active: int = 0


# Failures that another attempt can fix: memory that may be freed, a source that may come back.
_RETRYABLE = (torch.OutOfMemoryError, MemoryError, ConnectionError, TimeoutError)
# OS errors of a moment (a full disk, an I/O fault, too many open files) rather than of the model directory.
_TRANSIENT_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EIO, errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE, errno.ESTALE, errno.EINTR}
)
# Failures that only a change to the worker's packages, the model config or the model directory fixes:
# a missing Python dependency, an unsupported architecture or layout (ValueError, KeyError,
# NotImplementedError), a missing or unreadable file in the resolved (local) directory (OSError), a config
# value the model cannot be built from (a wrong type that transformers' config validation or torch refuses,
# a zero that it divides by).
_PERMANENT = (
    FailedPrecondition,
    ModelConfigError,
    ImportError,
    ValueError,
    KeyError,
    NotImplementedError,
    OSError,
    SafetensorError,
    StrictDataclassError,
    TypeError,
    ArithmeticError,
)
# RuntimeErrors torch raises when an allocation fails (the CPU allocator's, CUDA's own out-of-memory message).
_OUT_OF_MEMORY_MESSAGES = ("out of memory", "can't allocate memory")
# RuntimeErrors transformers and torch raise for weights that do not fit the architecture.
_BAD_WEIGHTS_MESSAGES = ("ignore_mismatched_sizes", "Error(s) in loading state_dict", "size mismatch")


def is_permanent(error: BaseException) -> bool:
    """Whether a load failure stays until the worker's packages, the config or the model files change.

    Permanent: missing weights (every source missed), a missing Python dependency anywhere in loading (an
    ImportError in the error or its causes), an unsupported architecture or layout, a bad or missing file in
    the model directory, a config value the model cannot be built from, weights that do not fit the
    architecture, an adapter the worker lacks. Retryable:
    out of memory, a cache or the Hub unreachable, transient OS errors, and anything not known to be permanent.
    """
    if isinstance(error, WeightsNotFound):
        return not error.retryable
    if isinstance(error, _RETRYABLE) or (isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS):
        return False
    # Before the ImportError chain: code that falls back when an optional import fails may run out of memory
    # in its `except ImportError` block, and the ImportError is then the failure's context, not its cause.
    if isinstance(error, RuntimeError) and any(message in str(error) for message in _OUT_OF_MEMORY_MESSAGES):
        return False
    if _import_error_in(error) is not None:
        return True
    if isinstance(error, RuntimeError):
        return any(message in str(error) for message in _BAD_WEIGHTS_MESSAGES)
    return isinstance(error, _PERMANENT)


def _import_error_in(error: BaseException) -> ImportError | None:
    """The ImportError in an error's chain of causes, if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, ImportError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_failure(error: BaseException) -> str:
    """The cause of a load failure for callers: our own errors as they are, others with their type (and a
    missing dependency behind them)."""
    if isinstance(error, (FailedPrecondition, ModelConfigError, WeightsNotFound)):
        return str(error)
    described = f"{type(error).__name__}: {error}"
    missing = _import_error_in(error)
    if missing is not None and missing is not error:
        described += f" (caused by {type(missing).__name__}: {missing})"
    return described


class ModelRegistry:
    def __init__(self, catalog: Catalog, settings: WorkerSettings, device: torch.device) -> None:
        self._catalog = catalog
        self._configs = catalog.configs
        self._settings = settings
        self._cpu_flags = cpu_flags(settings.cpu_flags)
        self._device = device
        self._weights = WeightResolver(settings, catalog.weight_roots)
        self.pressure = MemoryPressure(device, settings)
        self._loaded: dict[Key, LoadedModel] = {}
        self._loading: dict[Key, asyncio.Task[LoadedModel]] = {}
        self._unloading: dict[Key, asyncio.Future[None]] = {}
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
            await self._make_room(await asyncio.to_thread(weight_file_bytes, weights.path))
            loaded = await in_passing_thread(self._build_serialized, config, profile, weights)
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

    def _build_serialized(self, config: ModelConfig, profile_name: str, weights: ResolvedWeights) -> LoadedModel:
        with LOAD_LOCK:
            return self._build(config, profile_name, weights)

    def _build(self, config: ModelConfig, profile_name: str, weights: ResolvedWeights) -> LoadedModel:
        profile = config.profile(profile_name)
        factory = ADAPTERS.get(profile.adapter or "")
        if factory is None:
            raise ValueError(
                f"adapter {profile.adapter!r} is not in this worker; available: {', '.join(sorted(ADAPTERS))}"
            )

        def build(dtype: torch.dtype, *, cpu_onednn: bool) -> ModelAdapter:
            return factory(
                LoadContext(
                    config=config,
                    profile=profile,
                    weights=weights.path,
                    device=self._device,
                    dtype=dtype,
                    attention_backend=self._settings.attention_backend,
                    cpu_onednn=cpu_onednn,
                    cpu_unpadded=self._settings.cpu_unpadded,
                )
            )

        if self._device.type == "cpu":
            adapter = load_on_cpu(
                f"{config.id} (profile {profile_name})",
                profile.compute_precision or self._settings.cpu_compute_precision,
                self._cpu_flags,
                build,
                onednn=self._settings.cpu_onednn,
                min_agreement=self._settings.precision_min_cosine,
                has_loras=bool(config.loras),
            ).adapter
        else:
            precision = profile.compute_precision or self._settings.default_compute_precision
            if precision == "int8":  # dynamic int8 quantisation is a CPU path
                precision = self._settings.default_compute_precision
            adapter = build(compute_dtype(self._device, precision), cpu_onednn=self._settings.cpu_onednn)
        check_adapter_serves(config, profile.adapter or "", adapter)
        loras = LoraAdapters(
            config.id,
            adapter.model,
            config.loras,
            capacity=self._settings.max_loras_per_model,
            local_cache=self._settings.local_cache,
            hf_fallback=self._settings.hf_fallback,
            roots=self._catalog.weight_roots,
        )
        return LoadedModel(
            config,
            profile_name,
            adapter,
            self._stats[config.id],
            loras,
            weights_key=weights_key(config),
            memory_bytes=module_bytes(adapter),
        )

    def _record_failure(self, key: Key, error: Exception) -> None:
        previous = self._failures.get(key)
        attempts = (previous.attempts if previous else 0) + 1
        permanent = is_permanent(error)
        cooldown = min(MAX_COOLDOWN_S, self._settings.load_retry_cooldown_s * 2 ** (attempts - 1))
        refusal = error if isinstance(error, FailedPrecondition) else None
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
    def loaded_bytes(self) -> int:
        return sum(model.memory_bytes for model in self._loaded.values())

    async def _make_room(self, incoming_bytes: int, *, spare_newest: bool = False) -> None:
        """Evict least recently used idle models while `incoming_bytes` more would be over the threshold.

        `spare_newest` keeps the most recently used model, so memory held by
        something else (another process on the GPU) cannot make the monitor
        unload every model in turn."""
        while self.pressure.over(self.loaded_bytes, incoming_bytes):
            idle = sorted((model.last_used, key) for key, model in self._loaded.items() if model.active == 0)
            if spare_newest and idle and len(idle) == len(self._loaded):
                idle.pop()
            if not idle:
                # The monitor meets this every check while something else holds the memory: keep it quiet.
                log.log(
                    logging.DEBUG if spare_newest else logging.WARNING,
                    "memory over %s; no idle model left to evict",
                    self.pressure.describe(),
                )
                return
            _, key = idle[0]
            await self.unload(key, f"memory over {self.pressure.describe()}")

    async def unload(self, key: Key, why: str) -> None:
        model = self._loaded.pop(key, None)
        if model is None:
            return
        log.info("evicting %s (profile %s): %s", key[0], key[1], why)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unloading[key] = done
        del model  # the last reference: _free_memory can reclaim it
        try:
            await asyncio.to_thread(_free_memory)
        finally:
            self._unloading.pop(key, None)
            done.set_result(None)

    async def monitor(self) -> None:
        """Background: evict idle models (SIE_IDLE_EVICT_S) and LRU models under memory pressure."""
        while True:
            await asyncio.sleep(self._settings.memory_check_interval_s)
            try:
                await self.check_memory()
            except Exception:
                log.exception("memory check failed")

    async def check_memory(self) -> None:
        idle_limit = self._settings.idle_evict_s
        if idle_limit > 0:
            now = time.monotonic()
            idle = [
                key for key, model in self._loaded.items() if model.active == 0 and now - model.last_used > idle_limit
            ]
            for key in idle:
                await self.unload(key, f"idle for more than {idle_limit:.0f} s")
        await self._make_room(0, spare_newest=True)

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


def _free_memory() -> None:
    gc.collect()
    release_cuda_cache()
