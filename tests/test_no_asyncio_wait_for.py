"""No service, library or client code awaits with asyncio.wait_for.

On Python 3.11 (our floor), wait_for returns the awaited result when that result and the caller's cancellation come in
the same turn of the event loop, and the cancellation is lost: the cancelled task runs on. A gateway's stop waited
for ever on an etcd watch that had swallowed its cancel (tests/test_etcd_mirror_stop.py); a worker's batch former and
the client's stream reader had the same pattern. asyncio.timeout / timeout_at keep the cancellation."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("services", "lib", "clients", "deploy", "tools")


def _wait_for_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "asyncio":
            lines += [node.lineno for alias in node.names if alias.name == "wait_for"]
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "wait_for"
            and isinstance(node.value, ast.Name)
            and node.value.id == "asyncio"
        ):
            lines.append(node.lineno)
    return lines


def test_no_code_awaits_with_asyncio_wait_for() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in SOURCES
        for path in sorted((ROOT / folder).rglob("*.py"))
        if ".venv" not in path.parts
        for line in _wait_for_calls(path)
    ]
    assert found == [], f"asyncio.wait_for loses a cancellation on Python 3.11; use asyncio.timeout: {found}"
