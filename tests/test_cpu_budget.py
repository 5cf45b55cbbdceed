"""The CPU budget of model weights: an explicit SIE_CPU_MEMORY_BUDGET_MB wins (0: no limit), else a share of the
machine's memory, MemTotal or the cgroup's limit when lower."""

from __future__ import annotations

from pathlib import Path

import pytest
from sie_common.runtime.settings import SettingsError
from sie_worker.models.memory import cpu_budget_bytes, machine_memory_bytes
from sie_worker.settings import WorkerSettings

GIB = 2**30


@pytest.fixture
def meminfo(tmp_path: Path) -> Path:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {16 * GIB // 1024} kB\nMemFree:        1024 kB\n")
    return path


def test_memtotal_without_a_cgroup_limit(meminfo: Path, tmp_path: Path) -> None:
    assert machine_memory_bytes(meminfo, [tmp_path / "absent"]) == 16 * GIB


@pytest.mark.parametrize(
    ("limit", "expected"),
    [("max", 16 * GIB), (str(4 * GIB), 4 * GIB), (str(9223372036854771712), 16 * GIB)],
    ids=["v2 no limit", "limit lower than MemTotal", "v1 no limit"],
)
def test_a_cgroup_limit_counts_when_lower(meminfo: Path, tmp_path: Path, limit: str, expected: int) -> None:
    (tmp_path / "memory.max").write_text(limit + "\n")
    assert machine_memory_bytes(meminfo, [tmp_path / "memory.max"]) == expected


def test_unset_budget_is_the_fraction_of_the_machine() -> None:
    assert cpu_budget_bytes(WorkerSettings(cpu_memory_fraction=0.25)) == int(0.25 * machine_memory_bytes())
    assert cpu_budget_bytes(WorkerSettings()) == int(0.5 * machine_memory_bytes()) > 0


def test_an_explicit_budget_wins_and_zero_means_no_limit() -> None:
    assert cpu_budget_bytes(WorkerSettings(cpu_memory_budget_mb=100, cpu_memory_fraction=0.25)) == 100 * 2**20
    assert cpu_budget_bytes(WorkerSettings(cpu_memory_budget_mb=0)) == 0
    assert cpu_budget_bytes(WorkerSettings(cpu_memory_fraction=0)) == 0


@pytest.mark.parametrize("fields", [{"cpu_memory_fraction": 1.5}, {"cpu_memory_fraction": -0.1}, {"cpu_memory_budget_mb": -1}])
def test_out_of_range_values_refuse_to_start(fields: dict) -> None:
    with pytest.raises(SettingsError):
        WorkerSettings(**fields)
