"""How make test hands the suite's files to its pytest-xdist processes (tests/parallel_files.py), in-process: the
real scheduler, driven by two stand-in worker processes that record what they are sent and report each test done."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from parallel_files import (
    TIER_SECONDS,
    FileGroupScheduling,
    file_seconds,
    longest_first,
    record_seconds,
    write_groups,
)

COLLECTION = [
    "tests/a.py::test_one",
    "tests/b.py::test_one",
    "tests/b.py::test_two",
    "tests/c.py::test_p[x::y]",  # a parameter with "::" in it: still tests/c.py
    "tests/d.py::Class::test_one",
    "tests/e.py::test_one",
]


class RecordingNode:
    """What the scheduler sees of one pytest-xdist worker process: it is sent test indexes and may be shut down."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.extend(indexes)

    def shutdown(self) -> None:
        self.shutting_down = True


class TwoProcesses:
    """The parts of pytest.Config the scheduler reads, for `-n 2 --no-loadscope-reorder`."""

    def __init__(self) -> None:
        self.option = type("Option", (), {"loadscopereorder": False})()

    def getvalue(self, name: str) -> Any:
        return {"tx": ["2*popen"]}[name]


def run_on_two_processes(groups_file: Path) -> dict[str, str]:
    """Schedule COLLECTION on two processes, each running what it is sent in order; test -> the process that ran it."""
    scheduler = FileGroupScheduling(cast(pytest.Config, TwoProcesses()), None, groups_file)
    nodes = [RecordingNode("gw0"), RecordingNode("gw1")]
    for node in nodes:
        scheduler.add_node(node)  # type: ignore[arg-type]
    for node in nodes:
        scheduler.add_node_collection(node, COLLECTION)  # type: ignore[arg-type]
    scheduler.schedule()
    ran: dict[str, str] = {}
    done = {node.name: 0 for node in nodes}
    while any(done[node.name] < len(node.sent) for node in nodes):
        for node in nodes:
            if done[node.name] < len(node.sent):
                index = node.sent[done[node.name]]
                done[node.name] += 1
                assert COLLECTION[index] not in ran, "a test was sent twice"
                ran[COLLECTION[index]] = node.name
                scheduler.mark_test_complete(node, index)  # type: ignore[arg-type]
    assert scheduler.tests_finished
    return ran


def test_the_files_of_one_group_run_in_one_process_and_every_test_runs_once(tmp_path: Path) -> None:
    groups = tmp_path / "groups.json"
    write_groups(groups, {"tests/a.py": "edge", "tests/d.py": "edge"})  # without: a.py and d.py run apart
    ran = run_on_two_processes(groups)
    assert sorted(ran) == sorted(COLLECTION)
    assert ran["tests/a.py::test_one"] == ran["tests/d.py::Class::test_one"]
    assert ran["tests/b.py::test_one"] == ran["tests/b.py::test_two"]
    assert len(set(ran.values())) == 2  # and the rest is spread over both


def test_without_groups_each_file_is_a_unit_of_its_own(tmp_path: Path) -> None:
    scheduler = FileGroupScheduling(cast(pytest.Config, TwoProcesses()), None, tmp_path / "absent.json")
    assert [scheduler._split_scope(nodeid) for nodeid in COLLECTION] == [
        "tests/a.py",
        "tests/b.py",
        "tests/b.py",
        "tests/c.py",
        "tests/d.py",
        "tests/e.py",
    ]


def test_groups_are_written_whole_and_replace_the_last_ones(tmp_path: Path) -> None:
    path = tmp_path / "groups.json"
    write_groups(path, {"tests/b.py": "edge"})
    write_groups(path, {"tests/d.py": "auth_edge"})
    scheduler = FileGroupScheduling(cast(pytest.Config, TwoProcesses()), None, path)
    assert scheduler._split_scope("tests/d.py::t") == "auth_edge"
    assert scheduler._split_scope("tests/b.py::t") == "tests/b.py"
    assert [entry.name for entry in tmp_path.iterdir()] == ["groups.json"]  # no partial file left behind


def test_the_files_that_took_longest_go_first_a_group_as_one_and_untimed_ones_by_their_tier() -> None:
    files = ["tests/a.py", "tests/b.py", "tests/c.py", "tests/d.py", "tests/e.py", "tests/f.py"]
    tiers = {"tests/a.py": 3, "tests/b.py": 2, "tests/c.py": 2, "tests/d.py": 2, "tests/e.py": 1, "tests/f.py": 3}
    groups = {"tests/b.py": "edge", "tests/d.py": "edge"}  # 8 s + 9 s: 17 s as one unit, b before d
    seconds = {"tests/a.py": 2.0, "tests/b.py": 8.0, "tests/c.py": 12.0, "tests/d.py": 9.0, "tests/f.py": 2.0}
    assert longest_first(files, tiers, groups, seconds) == [
        "tests/e.py",  # not timed yet: a cluster file, TIER_SECONDS[1]
        "tests/b.py",
        "tests/d.py",
        "tests/c.py",
        "tests/a.py",  # a tie with f: collection order
        "tests/f.py",
    ]
    assert TIER_SECONDS[1] > 8.0 + 9.0
    # Nothing timed: by tier, collection order within one.
    assert longest_first(files, tiers, {}, {}) == [
        "tests/e.py", "tests/b.py", "tests/c.py", "tests/d.py", "tests/a.py", "tests/f.py",
    ]  # fmt: skip


def test_this_checkouts_last_run_orders_first_and_the_recorded_run_fills_in(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "tests" / name).touch()
    known = tmp_path / "file_seconds.json"
    record_seconds({"tests/a.py": 3.04, "tests/b.py": 40.0, "tests/gone.py": 9.0}, tmp_path, known)
    assert json.loads(known.read_text()) == {"tests/a.py": 3.0, "tests/b.py": 40.0}  # a deleted file left out
    assert file_seconds({"tests/b.py": 5.0, "tests/c.py": 7.0}, known) == {
        "tests/a.py": 3.0,
        "tests/b.py": 5.0,
        "tests/c.py": 7.0,
    }
    assert file_seconds({}, tmp_path / "absent.json") == {}
