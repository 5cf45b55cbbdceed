"""The reliability summary: rows the fault, load, hostile-input and fuzzing tests add as they run.

Every row is printed under "reliability summary" at the end of the run (even
without -v), grouped by section, and merged into build/reliability.json (rows
keyed by section and name), from which tools/reliability_doc.py renders the
tables of docs/reliability.md. Under pytest-xdist each worker's rows go to the
controller, which prints and saves them all; rows are ordered by the file of
the test that added them, then in the order that file added them, so the
saved order does not depend on which worker ran what.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPORT_FILE = Path(__file__).resolve().parents[2] / "build" / "reliability.json"


class ReliabilityReport:
    def __init__(self) -> None:
        # (file of the test that added it, row): a file's rows stay in the order it added them.
        self._rows: list[tuple[str, dict[str, object]]] = []
        self.source = ""  # the node id of the test running now (conftest.py sets it)

    def add(self, section: str, name: str, **figures: object) -> None:
        """One row: `figures` are its measured values (counts, seconds, statuses)."""
        self._rows.append((self.source.split("::")[0], {"section": section, "name": name, **figures}))

    @property
    def rows(self) -> list[dict[str, object]]:
        return [row for _, row in sorted(self._rows, key=lambda sourced: sourced[0])]

    def sections(self) -> dict[str, list[dict[str, object]]]:
        grouped: dict[str, list[dict[str, object]]] = {}
        for row in self.rows:
            grouped.setdefault(str(row["section"]), []).append(row)
        return grouped

    def dumps(self) -> str:
        """The rows, for another process's `merge` (values that are not JSON as their str)."""
        return json.dumps(self._rows, default=str)

    def merge(self, dumped: str) -> None:
        self._rows.extend((source, row) for source, row in json.loads(dumped))

    def save(self, path: Path) -> None:
        """Merge this run's rows into `path`: a row replaces the stored one with its section and name."""
        stored = json.loads(path.read_text()) if path.exists() else []
        rows = self.rows
        mine = {(row["section"], row["name"]) for row in rows}
        merged = [row for row in stored if (row["section"], row["name"]) not in mine] + rows
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=2, default=str) + "\n")

    def summarize(self, terminal: pytest.TerminalReporter, path: Path = REPORT_FILE) -> None:
        """Print every row under "reliability summary" and save them to `path`."""
        if not self._rows:
            return
        terminal.write_sep("=", "reliability summary")
        for section, rows in self.sections().items():
            terminal.write_line(f"[{section}]")
            for row in rows:
                figures = ", ".join(f"{key}={value}" for key, value in row.items() if key not in ("section", "name"))
                terminal.write_line(f"  {row['name']}: {figures}")
        self.save(path)
        terminal.write_line(f"(rows saved to {path})")
