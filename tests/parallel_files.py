"""How make test hands the suite's files to pytest-xdist workers: each file whole, and the files whose tests share a
session server that starts several processes (the HTTP edges) together, so it starts once.

--dist loadfile keeps a file's tests in one worker process, so its module fixtures start once. FileGroupScheduling
also keeps together the files of one group: each worker writes, once it has collected, the group of each file that
has one (tests/conftest.py decides them from the fixtures the file's tests use), and the controller reads that when
it hands out the work, after every worker has collected. (pytest-xdist's --dist loadgroup would need the group in
each node id, which it writes to an attribute pytest 9 no longer reads.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling

# The key of workerinput that names the file the workers write the groups to.
GROUPS_FILE = "sie_file_groups"


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
