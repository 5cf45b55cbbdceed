"""Building a served model: its adapter from the config's profile, in the precision the device and the settings pick
(on a CPU, checked against float32), checked against what its config asks of it; its LoRA adapters; its memory."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from sie_common.cluster.model_config import ModelConfig
from sie_worker.adapters.contract import Adapter, LoadContext
from sie_worker.models.cpu_precision import cpu_flags, load_on_cpu
from sie_worker.models.device import compute_dtype
from sie_worker.models.load_lock import LOAD_LOCK
from sie_worker.models.lora import LoraAdapters
from sie_worker.models.memory import module_bytes
from sie_worker.settings import WorkerSettings
from sie_worker.weights.cache import weights_key
from sie_worker.weights.resolver import ResolvedWeights
from sie_worker.weights.roots import WeightRoots


@dataclass
class ModelStats:
    requests: int = 0
    items: int = 0
    forward_passes: int = 0


@dataclass(eq=False)
class LoadedModel:
    config: ModelConfig
    profile: str
    adapter: Adapter
    stats: ModelStats
    loras: LoraAdapters
    weights_key: str = ""
    memory_bytes: int = 0
    last_used: float = field(default_factory=time.monotonic)
    # Requests holding the model; a model in use is never evicted.
    active: int = 0


class ModelBuilder:
    """Builds models with the adapters it is given (by name), on one device, under the worker's settings."""

    def __init__(
        self,
        settings: WorkerSettings,
        device: torch.device,
        weight_roots: WeightRoots,
        adapters: Mapping[str, type[Adapter]],
    ) -> None:
        self._settings = settings
        self._device = device
        self._weight_roots = weight_roots
        self._adapters = adapters
        self._cpu_flags = cpu_flags(settings.cpu_flags)

    def build(self, config: ModelConfig, profile_name: str, weights: ResolvedWeights, stats: ModelStats) -> LoadedModel:
        """The model of `config`'s profile `profile_name` from `weights`, counted in `stats`; raises what the load
        raised (sie_worker.models.load_errors says whether another attempt may succeed). One build at a time."""
        with LOAD_LOCK:
            return self._build(config, profile_name, weights, stats)

    def _build(
        self, config: ModelConfig, profile_name: str, weights: ResolvedWeights, stats: ModelStats
    ) -> LoadedModel:
        profile = config.profile(profile_name)
        factory = self._adapters.get(profile.adapter or "")
        if factory is None:
            raise ValueError(
                f"adapter {profile.adapter!r} is not in this worker; available: {', '.join(sorted(self._adapters))}"
            )
        factory.spec.check_config(config)

        def build(dtype: torch.dtype, *, cpu_onednn: bool) -> Adapter:
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
                int8_max_drift=self._settings.int8_max_drift,
                has_loras=bool(config.loras),
            ).adapter
        else:
            precision = profile.compute_precision or self._settings.default_compute_precision
            if precision == "int8":  # dynamic int8 quantisation is a CPU path
                precision = self._settings.default_compute_precision
            adapter = build(compute_dtype(self._device, precision), cpu_onednn=self._settings.cpu_onednn)
        loras = LoraAdapters(
            config.id,
            adapter.model,
            config.loras,
            capacity=self._settings.max_loras_per_model,
            local_cache=self._settings.local_cache,
            hf_fallback=self._settings.hf_fallback,
            roots=self._weight_roots,
        )
        return LoadedModel(
            config,
            profile_name,
            adapter,
            stats,
            loras,
            weights_key=weights_key(config),
            memory_bytes=module_bytes(adapter),
        )
