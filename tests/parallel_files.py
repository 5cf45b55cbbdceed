"""How make test hands the suite's files to pytest-xdist workers: each file whole, and the files whose tests share a
session server that starts several processes (the HTTP edges) together, so it starts once.

--dist loadfile keeps a file's tests in one worker process, so its module fixtures start once. FileGroupScheduling
also keeps together the files of one group: each worker writes, once it has collected, the group of each file that
has one (tests/conftest.py decides them from the fixtures the file's tests use), and the controller reads that when
it hands out the work, after every worker has collected. (pytest-xdist's --dist loadgroup would need the group in
each node id, which it writes to an attribute pytest 9 no longer reads.)

The files are handed out in collection order, and tests/conftest.py collects them longest first (`longest_first`):
by the seconds each file took the last time it ran here (pytest's cache, `FILE_SECONDS`), else in the run recorded in
tests/file_seconds.json (`KNOWN_SECONDS`, what a clean clone such as CI's orders by; `make test-durations` rewrites it
from this checkout's last `make test`), a group's files as one unit, so the run does not end with one process alone on
a long file. A file timed in neither counts as a typical file of its tier.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

# The key of workerinput that names the file the workers write the groups to.
GROUPS_FILE = "sie_file_groups"
# The key of pytest's cache that holds each file's seconds (its tests' setup, call and teardown) in the last run.
FILE_SECONDS = "sie/file-seconds"
# Each file's seconds in a recorded `make test` run, committed: the order of a run with nothing in its cache.
KNOWN_SECONDS = Path(__file__).with_name("file_seconds.json")
# What a file not timed yet is taken to last, by its tier (tests/conftest.py): it has slow tests, starts a cluster,
# starts other processes, or none (the averages of a run on two busy cores, rounded).
TIER_SECONDS = (60.0, 30.0, 10.0, 1.0)


class FileGroupScheduling(LoadFileScheduling):
    """--dist loadfile, with the files of one group handed out as one unit (the first file's place in the order)."""

    def __init__(self, config: pytest.Config, log: Producer, groups_file: Path) -> None:
        super().__init__(config, log)
        self._groups_file = groups_file
        self._groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        path = super()._split_scope(nodeid)
        if self._groups is None:  # first called once every worker has collected (and written the file)
            self._groups = json.loads(self._groups_file.read_text()) if self._groups_file.exists() else {}
        return self._groups.get(path, path)


def write_groups(path: Path, groups: dict[str, str]) -> None:
    """Write file -> group whole (every worker writes the same; a reader never sees half of one)."""
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(groups))
    partial.replace(path)


def file_seconds(cached: Mapping[str, float], known: Path = KNOWN_SECONDS) -> dict[str, float]:
    """Each file's seconds: this checkout's last run (`cached`, pytest's cache) where it has the file, else the
    recorded run's (`known`)."""
    recorded = json.loads(known.read_text()) if known.exists() else {}
    return {**recorded, **cached}


def record_seconds(cached: Mapping[str, float], root: Path, known: Path = KNOWN_SECONDS) -> None:
    """Write `cached` (a run's seconds per file, pytest's cache) as the recorded run, one file a line, sorted: the
    files still under `root` (the cache keeps a deleted or renamed file's last time)."""
    rows = [
        f"  {json.dumps(path)}: {seconds:.1f}" for path, seconds in sorted(cached.items()) if (root / path).exists()
    ]
    known.write_text("{\n" + ",\n".join(rows) + "\n}\n")


def longest_first(
    files: Sequence[str], tiers: Mapping[str, int], groups: Mapping[str, str], seconds: Mapping[str, float]
) -> list[str]:
    """`files` (in collection order) reordered so the units (a group's files, or a file) that take longest come
    first: by their seconds in the last run, or their tier's TIER_SECONDS if not timed; ties keep collection order,
    and a group's files stay together in their own order."""
    unit_seconds: Counter[str] = Counter()
    first: dict[str, int] = {}
    for index, path in enumerate(files):
        unit = groups.get(path, path)
        unit_seconds[unit] += seconds.get(path, TIER_SECONDS[tiers[path]])
        first.setdefault(unit, index)
    position = {path: index for index, path in enumerate(files)}

    def key(path: str) -> tuple[float, int, int]:
        unit = groups.get(path, path)
        return -unit_seconds[unit], first[unit], position[path]

    return sorted(files, key=key)


if __name__ == "__main__":  # make test-durations: this checkout's last make test becomes the recorded run
    root = Path(__file__).resolve().parent.parent
    cache = root / ".pytest_cache" / "v" / FILE_SECONDS
    if not cache.exists():
        raise SystemExit(f"no timings in {cache}: run make test first")
    record_seconds(json.loads(cache.read_text()), root)
