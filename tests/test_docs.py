"""The docs name every knob the code has."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sie_config.settings import ConfigSettings
from sie_gateway.settings import GatewaySettings
from sie_stack.settings import StackSettings
from sie_worker.settings import WorkerSettings

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.parametrize("settings_type", [WorkerSettings, ConfigSettings, GatewaySettings, StackSettings])
def test_every_setting_is_documented(settings_type: type) -> None:
    text = (DOCS / "configuration.md").read_text()
    for field in dataclasses.fields(settings_type):
        flag = "--" + field.name.replace("_", "-")
        assert f"`{field.metadata['env']}`" in text, f"{field.metadata['env']} missing from docs/configuration.md"
        assert f"`{flag}" in text, f"{flag} missing from docs/configuration.md"


def test_every_error_reason_is_documented() -> None:
    import re

    root = Path(__file__).resolve().parents[1]
    reasons = set()
    for path in [*(root / "services").rglob("*.py"), *(root / "lib").rglob("*.py")]:
        reasons |= set(re.findall(r'reason="([A-Z_]+)"', path.read_text()))
    documented = (DOCS / "api.md").read_text()
    assert reasons, "no reasons found"
    missing = sorted(reason for reason in reasons if f"`{reason}`" not in documented)
    assert not missing, f"undocumented error reasons: {missing}"
