"""Adversarial pass over the issue-23 restructure (folders, request plans, batch keys, settings, distributions): real
worker processes, each case something the restructure could have changed for a caller or an operator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sie_common

# Every test runs a worker or a Python subprocess.
pytestmark = pytest.mark.process

STARTUP_TIMEOUT_S = 60


def installed_sie_common(root: Path) -> Path:
    """A copy of sie_common outside the checkout, as a non-editable install has it: no repository bundles/ beside
    it. Returns the folder to put first on PYTHONPATH."""
    site = root / "site-packages"
    shutil.copytree(Path(sie_common.__file__).parent, site / "sie_common", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_installed_worker_with_an_unknown_bundle_says_what_is_missing(tmp_path: Path) -> None:
    """An installed worker (no repository beside it, SIE_BUNDLES_DIR unset) asked for a bundle other than `default`
    refuses to start. Before the restructure the message named a directory that did not exist; after it, it read
    "is not a bundle in None". It must say that SIE_BUNDLES_DIR is not set."""
    site = installed_sie_common(tmp_path)
    models = tmp_path / "models"
    models.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        "SIE_BUNDLE": "gpu",
        "SIE_MODELS_DIR": str(models),
        "SIE_PORT": "0",
        "SIE_WORKER_METRICS_PORT": "0",
    }
    env.pop("SIE_BUNDLES_DIR", None)
    env.pop("SIE_ETCD_ENDPOINTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "sie_worker", "serve"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
    )
    assert result.returncode != 0
    assert "SIE_BUNDLE='gpu' is not a bundle" in result.stderr, result.stderr[-2000:]
    assert "SIE_BUNDLES_DIR is not set" in result.stderr, result.stderr[-2000:]
    assert " None" not in result.stderr, result.stderr[-2000:]


def client_only_path() -> str:
    """PYTHONPATH with the client and the contract and nothing else of the repository: the client installed alone."""
    root = Path(__file__).resolve().parents[2]
    return os.pathsep.join([str(root / "clients" / "python"), str(root / "contract" / "python")])


def test_blocking_client_documents_encode_and_extract_as_the_async_client_does() -> None:
    """help(SIEClient.encode) and help(SIEClient.extract) showed the async client's documentation (a functools.wraps
    wrapper) before the restructure; the overloads spelled out for typing left them without any."""
    program = (
        "import json\n"
        "from sie_client import AsyncSIEClient, SIEClient\n"
        "print(json.dumps({name: [getattr(SIEClient, name).__doc__, getattr(AsyncSIEClient, name).__doc__]\n"
        "                  for name in ('encode', 'score', 'extract')}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        env={**os.environ, "PYTHONPATH": client_only_path()},
        capture_output=True,
        text=True,
        timeout=STARTUP_TIMEOUT_S,
        check=True,
    )
    docs = json.loads(result.stdout)
    for name, (blocking, awaitable) in docs.items():
        assert awaitable, name
        assert blocking == awaitable, name
