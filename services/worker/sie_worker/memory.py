"""How much memory models take, when the worker is under memory pressure, and
how a batch that runs out of device memory is retried.

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

import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from sie_common.errors import ResourceExhausted
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

T = TypeVar("T")

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
    return sum(path.stat().st_size for path in directory.rglob("*") if path.suffix in _WEIGHT_SUFFIXES and path.is_file())


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


def run_splitting_on_oom(
    run: Callable[[Sequence[T]], Any],
    items: Sequence[T],
    *,
    is_oom: Callable[[BaseException], bool],
    recover: Callable[[], None] = lambda: None,
) -> list[Any]:
    """`run(items)` (one output per item); when it runs out of memory, run each half separately (recursively).

    A single item that still does not fit is RESOURCE_EXHAUSTED."""
    try:
        return list(run(items))
    except Exception as error:
        if not is_oom(error):
            raise
        recover()
        if len(items) == 1:
            raise ResourceExhausted(
                f"out of device memory on a single item ({error}); send shorter inputs or free the device",
                reason="DEVICE_OUT_OF_MEMORY",
            ) from error
        log.warning("out of memory on a batch of %d items; retrying in halves", len(items))
        middle = len(items) // 2
        first = run_splitting_on_oom(run, items[:middle], is_oom=is_oom, recover=recover)
        second = run_splitting_on_oom(run, items[middle:], is_oom=is_oom, recover=recover)
        return first + second


def is_cuda_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError)


def release_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
