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
    # The contract's reasons are in api.md; those only the HTTP wires answer (JSON, msgpack) in http.md.
    documented = (DOCS / "api.md").read_text() + (DOCS / "http.md").read_text()
    assert reasons, "no reasons found"
    missing = sorted(reason for reason in reasons if f"`{reason}`" not in documented)
    assert not missing, f"undocumented error reasons: {missing}"


# Where each first-party package's folder is, for paths the docs name from the package down.
PACKAGE_ROOTS = {
    "sie_worker": "services/worker",
    "sie_gateway": "services/gateway",
    "sie_config": "services/config",
    "sie_common": "lib",
    "sie_client": "clients/python",
    "sie_contract": "contract/python",
    "sie_stack": "deploy/local",
}


@pytest.mark.parametrize("doc", ["docs/architecture.md", "README.md"])
def test_every_source_path_the_docs_name_exists(doc: str) -> None:
    """docs/architecture.md and the README's layout name the file that owns each step: after a move they must follow."""
    import re

    root = DOCS.parent
    text = (root / doc).read_text()
    paths = set(re.findall(r"`((?:[\w.-]+/)+[\w.-]*)`", text))
    # build/ holds what tools and tests write (the protos' staged dependencies, the reliability report): whether a
    # path under it exists yet depends on what ran before, not on the sources.
    top_level = {entry.name for entry in root.iterdir() if not entry.name.startswith(".")} - {"build"}
    missing = []
    for path in sorted(paths):
        first = path.split("/")[0]
        if first in PACKAGE_ROOTS:
            if not (root / PACKAGE_ROOTS[first] / path).exists():
                missing.append(path)
        elif first in top_level and not (root / path).exists():
            missing.append(path)
    assert not missing, f"{doc} names paths that do not exist: {missing}"
