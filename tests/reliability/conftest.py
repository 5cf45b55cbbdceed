"""The reliability suite's report: each test adds rows, the terminal summary prints them by section."""

from __future__ import annotations

from collections import defaultdict

import pytest


class ReliabilityReport:
    def __init__(self) -> None:
        self.sections: dict[str, list[tuple[str, dict[str, object]]]] = defaultdict(list)

    def add(self, section: str, name: str, **figures: object) -> None:
        """One row: what was checked (`name`) and what was measured."""
        self.sections[section].append((name, figures))


_REPORT = ReliabilityReport()


@pytest.fixture(scope="session")
def reliability_report() -> ReliabilityReport:
    return _REPORT


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _REPORT.sections:
        return
    terminalreporter.section("reliability summary")
    for section, rows in _REPORT.sections.items():
        terminalreporter.write_line(f"{section}:")
        for name, figures in rows:
            shown = ", ".join(f"{key}={value}" for key, value in figures.items())
            terminalreporter.write_line(f"  {name}: {shown}")
