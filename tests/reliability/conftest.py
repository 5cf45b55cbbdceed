"""The reliability summary: rows the fault, load, hostile-input and fuzzing tests add as they run.

Every row is printed under "reliability summary" at the end of the run (even
without -v), grouped by section, and merged into build/reliability.json (rows
keyed by section and name), from which tools/reliability_doc.py renders the
tables of docs/reliability.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPORT_FILE = Path(__file__).resolve().parents[2] / "build" / "reliability.json"


class ReliabilityReport:
    def __init__(self) -> None:
        self.rows: list[dict[str, object]] = []

    def add(self, section: str, name: str, **figures: object) -> None:
        """One row: `figures` are its measured values (counts, seconds, statuses)."""
        self.rows.append({"section": section, "name": name, **figures})

    def sections(self) -> dict[str, list[dict[str, object]]]:
        grouped: dict[str, list[dict[str, object]]] = {}
        for row in self.rows:
            grouped.setdefault(str(row["section"]), []).append(row)
        return grouped

    def save(self, path: Path) -> None:
        """Merge this run's rows into `path`: a row replaces the stored one with its section and name."""
        stored = json.loads(path.read_text()) if path.exists() else []
        mine = {(row["section"], row["name"]) for row in self.rows}
        merged = [row for row in stored if (row["section"], row["name"]) not in mine] + self.rows
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=2, default=str) + "\n")


_REPORT = ReliabilityReport()


@pytest.fixture(scope="session")
def reliability_report() -> ReliabilityReport:
    return _REPORT


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORT.rows:
        return
    terminalreporter.write_sep("=", "reliability summary")
    for section, rows in _REPORT.sections().items():
        terminalreporter.write_line(f"[{section}]")
        for row in rows:
            figures = ", ".join(f"{key}={value}" for key, value in row.items() if key not in ("section", "name"))
            terminalreporter.write_line(f"  {row['name']}: {figures}")
    _REPORT.save(REPORT_FILE)
    terminalreporter.write_line(f"(rows saved to {REPORT_FILE})")
