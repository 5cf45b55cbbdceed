"""The docs name every knob the code has."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sie_worker.settings import WorkerSettings

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_every_worker_setting_is_documented() -> None:
    text = (DOCS / "configuration.md").read_text()
    for field in dataclasses.fields(WorkerSettings):
        flag = "--" + field.name.replace("_", "-")
        assert f"`{field.metadata['env']}`" in text, f"{field.metadata['env']} missing from docs/configuration.md"
        assert f"`{flag}" in text, f"{flag} missing from docs/configuration.md"


def test_every_error_reason_is_documented() -> None:
    import re

    sources = Path(__file__).resolve().parents[1] / "services"
    reasons = set()
    for path in sources.rglob("*.py"):
        reasons |= set(re.findall(r'reason="([A-Z_]+)"', path.read_text()))
    documented = (DOCS / "api.md").read_text()
    assert reasons, "no reasons found"
    missing = sorted(reason for reason in reasons if f"`{reason}`" not in documented)
    assert not missing, f"undocumented error reasons: {missing}"
