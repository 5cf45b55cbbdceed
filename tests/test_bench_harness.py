"""The benchmark harness's own logic: paths taking turns in a rotating order, and targets judged from a recorded run
with the amount by which a missed one is missed."""

from __future__ import annotations

import json
from pathlib import Path

import report
import workloads

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results"


def test_paths_take_turns_in_a_rotating_order(monkeypatch) -> None:
    monkeypatch.setattr(workloads, "SINGLE_WARMUP", 0)
    calls: list[int] = []
    sends = [lambda texts, index=index: calls.append(index) for index in range(3)]

    measured = workloads.alternating_latencies_ms(sends, requests=6)

    assert [len(times) for times in measured] == [6, 6, 6]
    turns = [calls[start : start + 3] for start in range(0, len(calls), 3)]
    assert turns == [[0, 1, 2], [1, 2, 0], [2, 0, 1]] * 2
    for place in range(3):  # every path goes first, second and third equally often
        assert sorted(turn[place] for turn in turns) == [0, 0, 1, 1, 2, 2]


def test_a_missed_target_says_by_how_much() -> None:
    run6 = {check["target"]: check for check in report.targets(json.loads((RESULTS / "2026-11-23-x86_64-2cores-run6.json").read_text()))}
    sie = run6["standalone worker >= 1.3x sie-server at its best thread count (bulk, ratio)"]
    hop = run6["the gateway hop adds < 1 ms p50 (tiny model, ms)"]
    ceiling = run6["standalone worker >= 0.90x the in-process ceiling (bulk, ratio)"]

    assert (sie["met"], sie["missed_by"], round(sie["measured"], 2)) == (False, "0.06x", 1.24)
    assert (hop["met"], hop["missed_by"], round(hop["measured"], 2)) == (False, "0.20 ms", 1.20)
    assert (ceiling["met"], ceiling["missed_by"]) == (True, None)
    assert "| the gateway hop adds < 1 ms p50 (tiny model, ms) | 1.20 | **no** | 0.20 ms |" in report.table(
        json.loads((RESULTS / "2026-11-23-x86_64-2cores-run6.json").read_text())
    )


def test_paths_not_run_are_reported_as_not_measured() -> None:
    gateway_only = json.loads((RESULTS / "2026-11-23-x86_64-2cores-run10-gateway-only.json").read_text())
    checks = {check["target"]: check for check in report.targets(gateway_only)}

    assert checks["standalone worker >= 1.3x sie-server at its best thread count (bulk, ratio)"]["missed_by"] == "not measured in this run"
    assert checks["the gateway hop adds < 1 ms p50 (tiny model, ms)"]["missed_by"] == "0.04 ms"
