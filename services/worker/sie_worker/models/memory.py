"""How much memory models take, when the worker is under memory pressure, and which loaded models it evicts then.

On CUDA pressure is the device's used share (all processes, from
`torch.cuda.mem_get_info`) against SIE_MEMORY_PRESSURE_THRESHOLD_PERCENT. On
CPU it is the loaded models' weight bytes against the CPU budget:
parameter and buffer bytes are exact and the same on every run, where process
RSS moves with allocator caches and tokenizers and would make eviction depend
on timing. The budget is SIE_CPU_MEMORY_BUDGET_MB when set (0: no limit), else
SIE_CPU_MEMORY_FRACTION of the machine's memory: MemTotal, or the cgroup's
memory limit when that is lower (a container's). MPS has no usable counter; it
is never under pressure.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import torch

from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (model id, profile)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_MEMINFO = Path("/proc/meminfo")
# cgroup v2, then v1; "max" or a number past the machine's memory means no limit.
_CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def module_bytes(holder: object) -> int:
    """Bytes of the parameters and buffers of every torch module `holder` keeps as an attribute."""
    seen: set[int] = set()
    total = 0
    for value in vars(holder).values():
        if not isinstance(value, torch.nn.Module):
            continue
        for tensor in [*value.parameters(), *value.buffers()]:
            # Opaque tensors (oneDNN-packed weights) have no data pointer, and share no memory.
            key = id(tensor) if tensor.is_mkldnn else tensor.data_ptr()
            if key in seen:
                continue
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total


def weight_file_bytes(directory: Path) -> int:
    """Size of the weight files in a model directory: the estimate of a model's footprint before it loads."""
    return sum(
        path.stat().st_size for path in directory.rglob("*") if path.suffix in _WEIGHT_SUFFIXES and path.is_file()
    )


class MemoryPressure:
    """Says whether loading `incoming` more bytes would put the device over the threshold."""

    def __init__(self, device: torch.device, settings: WorkerSettings) -> None:
        self._device = device
        self._threshold = settings.memory_pressure_threshold_percent
        self._cpu_budget = cpu_budget_bytes(settings) if device.type == "cpu" else 0
        log.info("models are evicted over %s", self.describe())

    def over(self, loaded_bytes: int, incoming_bytes: int = 0) -> bool:
        if self._device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self._device)
            return (total - free + incoming_bytes) * 100 > self._threshold * total
        if self._device.type == "cpu" and self._cpu_budget > 0:
            return (loaded_bytes + incoming_bytes) * 100 > self._threshold * self._cpu_budget
        return False

    def describe(self) -> str:
        if self._device.type == "cuda":
            return f"{self._threshold:.0f}% of {self._device} memory"
        if self._device.type == "cpu" and self._cpu_budget > 0:
            return f"{self._threshold:.0f}% of a {self._cpu_budget / 2**20:.0f} MiB CPU budget"
        return "no limit"


def machine_memory_bytes(meminfo: Path = _MEMINFO, cgroup_limits: Sequence[Path] = _CGROUP_LIMITS) -> int:
    """The memory this process may use: MemTotal, or the first cgroup limit found when it is lower; 0 if unknown."""
    total = 0
    with contextlib.suppress(OSError, ValueError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                total = int(line.split()[1]) * 1024
    for path in cgroup_limits:
        with contextlib.suppress(OSError, ValueError):
            limit = path.read_text().strip()
            if limit != "max":
                return min(total, int(limit)) if total else int(limit)
            return total
    return total


def cpu_budget_bytes(settings: WorkerSettings) -> int:
    """The CPU budget of model weights: SIE_CPU_MEMORY_BUDGET_MB when set, else SIE_CPU_MEMORY_FRACTION of the
    machine's memory; 0 means no limit."""
    if settings.cpu_memory_budget_mb is not None:
        return int(settings.cpu_memory_budget_mb * 1024 * 1024)
    return int(settings.cpu_memory_fraction * machine_memory_bytes())


class Resident(Protocol):
    """What eviction reads of a loaded model."""

    memory_bytes: int
    last_used: float  # time.monotonic()
    active: int  # requests holding it: a model in use is never evicted


M = TypeVar("M", bound=Resident)


class ResidentModels(Generic[M]):
    """The loaded models by (model id, profile), and their eviction: least recently used idle models while memory is
    over the threshold (before a load, and from a background monitor), and models nobody used for
    SIE_IDLE_EVICT_S."""

    def __init__(self, pressure: MemoryPressure, settings: WorkerSettings) -> None:
        self.pressure = pressure
        self._settings = settings
        self.loaded: dict[Key, M] = {}
        # Models being unloaded: done once their memory is reclaimed.
        self.unloading: dict[Key, asyncio.Future[None]] = {}

    @property
    def loaded_bytes(self) -> int:
        return sum(model.memory_bytes for model in self.loaded.values())

    async def make_room(self, incoming_bytes: int, *, spare_newest: bool = False) -> None:
        """Evict least recently used idle models while `incoming_bytes` more would be over the threshold.

        `spare_newest` keeps the most recently used model, so memory held by
        something else (another process on the GPU) cannot make the monitor
        unload every model in turn."""
        while self.pressure.over(self.loaded_bytes, incoming_bytes):
            idle = sorted((model.last_used, key) for key, model in self.loaded.items() if model.active == 0)
            if spare_newest and idle and len(idle) == len(self.loaded):
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
        """Unload a model now (its memory is reclaimed off the event loop); a load of it waits until that is done."""
        model = self.loaded.pop(key, None)
        if model is None:
            return
        log.info("evicting %s (profile %s): %s", key[0], key[1], why)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.unloading[key] = done
        del model  # the last reference: _free_memory can reclaim it
        try:
            await asyncio.to_thread(_free_memory)
        finally:
            self.unloading.pop(key, None)
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
        """Evict the models idle past SIE_IDLE_EVICT_S, then LRU idle models while memory is over the threshold."""
        idle_limit = self._settings.idle_evict_s
        if idle_limit > 0:
            now = time.monotonic()
            idle = [
                key for key, model in self.loaded.items() if model.active == 0 and now - model.last_used > idle_limit
            ]
            for key in idle:
                await self.unload(key, f"idle for more than {idle_limit:.0f} s")
        await self.make_room(0, spare_newest=True)


def _free_memory() -> None:
    gc.collect()
    release_cuda_cache()
    release_heap()


def release_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim): an evicted model's tensors are freed,
    but without it the process keeps their pages, and a worker that loads model after model grows (a clean-clone
    run saw 169 MiB after 32 tiny models in turn under a 12 MiB budget)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS)
        return None


_LIBC = _glibc()


def is_cuda_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError)


def release_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
