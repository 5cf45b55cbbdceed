"""How much memory models take, when the worker is under memory pressure, and
how a batch that fails (out of device memory, or on one item) is retried in halves.

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

from sie_common.edge.errors import InvalidArgument, ResourceExhausted, SieError
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


def run_isolating_failures(
    run: Callable[[Sequence[T]], Any],
    items: Sequence[T],
    *,
    is_oom: Callable[[BaseException], bool],
    recover: Callable[[], None] = lambda: None,
) -> list[Any]:
    """`run(items)`, one output per item; when it raises, each half runs separately (recursively), so that a
    failure ends with the items that cause it and the others still get their outputs.

    Out of memory, `recover` runs before the halves do, and a single item that still does not fit fails with
    RESOURCE_EXHAUSTED. An item that fails on its own while others of the batch succeed has the cause in its
    input: INVALID_ARGUMENT (ITEM_FAILED). The failed items' errors stand in their outputs' places; when every
    item fails, the first error is raised for the whole batch, and so is a SieError `run` raises (not split)."""
    outcomes = _run_halving(run, items, is_oom, recover)
    failed = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if not failed:
        return outcomes
    if len(failed) == len(outcomes):
        raise failed[0]
    return [blame_item(outcome) if isinstance(outcome, BaseException) else outcome for outcome in outcomes]


def _run_halving(
    run: Callable[[Sequence[T]], Any],
    items: Sequence[T],
    is_oom: Callable[[BaseException], bool],
    recover: Callable[[], None],
) -> list[Any]:
    """One outcome per item: its output, or the exception it failed with alone."""
    try:
        return list(run(items))
    except SieError:  # a deliberate answer for the whole batch (a LoRA that cannot load, ...), not an item's fault
        raise
    except Exception as error:  # noqa: BLE001 - whatever else failed the pass, the halves tell which items cause it
        oom = is_oom(error)
        if oom:
            recover()
        if len(items) == 1:
            if oom:
                return [
                    ResourceExhausted(
                        f"out of device memory on a single item ({error}); send shorter inputs or free the device",
                        reason="DEVICE_OUT_OF_MEMORY",
                    )
                ]
            return [error]
        log.warning(
            "%s on a batch of %d items; retrying in halves", "out of memory" if oom else f"error ({error})", len(items)
        )
        middle = len(items) // 2
        return _run_halving(run, items[:middle], is_oom, recover) + _run_halving(run, items[middle:], is_oom, recover)


def blame_item(error: BaseException, *, because: str = "the other items of its batch succeeded") -> SieError:
    """An item's own failure (`because` says why the model is not to blame): INVALID_ARGUMENT unless it already is
    a SieError."""
    if isinstance(error, SieError):
        return error
    return InvalidArgument(
        f"the model failed on this item ({type(error).__name__}: {error}) while {because}; check the item's input",
        reason="ITEM_FAILED",
    )


def is_cuda_oom(error: BaseException) -> bool:
    return isinstance(error, torch.cuda.OutOfMemoryError)


def release_cuda_cache() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
