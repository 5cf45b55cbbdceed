"""The reference SDK (sie-sdk 0.10.1 from PyPI) in a virtual environment of its own under .pytest_cache/, for the
tests that compare sie_client with it. It needs Python 3.12; `reference_python()` finds one or says why not (the
tests skip with that reason). The first call creates the environment (about a minute: pip from PyPI), later calls
reuse it. Extra requirements get an environment of their own (the plain one stays as the SDK alone installs it).

On a clean clone (CI) making them is a minute or two of pip: under pytest-xdist the controller makes the ones the
collected files ask for (ENVIRONMENTS) while its workers run other files (tests/conftest.py), and a test that asks
meanwhile waits for it on the same lock instead of making it again."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_SDK = "sie-sdk==0.10.1"
# Under .pytest_cache (ignored by git, hidden from tests/test_docs.py's look at the top-level folders).
VENV = ROOT / ".pytest_cache" / "reference-sdk" / "sie-sdk-0.10.1"
# What tests/test_reference_integrations.py's suites import beyond this project's test environment, and what they need
# in the reference SDK's venv: the frameworks at this project's versions (CONSTRAINTS).
VECTOR_STORES = ("langchain-chroma==1.1.0", "llama-index-vector-stores-chroma==0.6.0")
SUITE_REQUIREMENTS = ("pytest", "pytest-asyncio", "langchain-core", "llama-index-core", "chromadb", *VECTOR_STORES)
CONSTRAINTS = ROOT / "constraints.txt"
# Test file -> the environment it asks for (reference_python's extra requirements; with CONSTRAINTS when any).
ENVIRONMENTS: dict[str, tuple[str, ...]] = {
    "tests/test_client_reference_behaviour.py": (),
    "tests/test_client_reference_surface.py": (),
    "tests/test_http_adapter_reference_sdk.py": (),
    "tests/test_reference_integrations.py": SUITE_REQUIREMENTS,
}


def python312() -> str | None:
    """A Python 3.12 interpreter: python3.12 on PATH, else one pyenv installed (its shim may not be active here)."""
    candidates = [shutil.which("python3.12")]
    pyenv_root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.12*/bin/python3.12"), reverse=True)
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "--version"], capture_output=True, text=True, check=False)
        if probe.returncode == 0 and probe.stdout.startswith("Python 3.12"):
            return candidate
    return None


def reference_python(*extra: str, constraints: Path | None = None) -> tuple[str | None, str]:
    """(the venv's python, "") with the reference SDK and `extra` requirements installed, or (None, why not).

    `extra` is installed first, within `constraints`; the reference SDK last, with its own pins, so where the two
    disagree (its websockets<15 against langsmith's >=15) the SDK under test gets what it asks for."""
    python = python312()
    if python is None:
        return None, "no Python 3.12 here (python3.12 on PATH or under pyenv): the reference SDK needs it"
    pins = constraints.read_text() if constraints else ""
    digest = hashlib.sha256(repr((REFERENCE_SDK, *sorted(extra), pins)).encode()).hexdigest()[:12]
    venv = VENV.with_name(f"{VENV.name}-{digest}") if extra else VENV
    marker = venv / f".installed-{digest}"
    VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(VENV.parent / ".sie-sdk.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one creator when several test processes ask at once
        if not marker.exists():
            pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
            steps = [[python, "-m", "venv", "--clear", str(venv)]] if not (venv / "bin" / "python").exists() else []
            if extra:
                steps.append([*pip, *(["-c", str(constraints)] if constraints else []), *extra])
            steps.append([*pip, REFERENCE_SDK])
            for step in steps:
                done = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
                if done.returncode != 0:
                    return None, f"could not install {REFERENCE_SDK}: {' '.join(step[-3:])}: {done.stderr[-500:]}"
            marker.touch()
    return str(venv / "bin" / "python"), ""


def suite_python() -> tuple[str | None, str]:
    """reference_python for the integration suites (SUITE_REQUIREMENTS within CONSTRAINTS)."""
    return reference_python(*SUITE_REQUIREMENTS, constraints=CONSTRAINTS)


def prepare(files: Iterable[str]) -> threading.Thread | None:
    """Make the environments that `files` (test files, relative to the checkout) ask for, in a thread of this
    process, one after another; None when they ask for none. What fails is left for the test to find and report."""
    wanted = sorted({ENVIRONMENTS[path] for path in files if path in ENVIRONMENTS})
    if not wanted:
        return None

    def make() -> None:
        for extra in wanted:
            reference_python(*extra, constraints=CONSTRAINTS if extra else None)

    thread = threading.Thread(target=make, name="reference-sdk-environments", daemon=True)
    thread.start()
    return thread
