"""The reference SDK (sie-sdk 0.10.1 from PyPI) in a virtual environment of its own under .pytest_cache/, for the
tests that compare sie_client with it. It needs Python 3.12; `reference_python()` finds one or says why not (the
tests skip with that reason). The first call creates the environment (about a minute: pip from PyPI), later calls
reuse it. Extra requirements get an environment of their own (the plain one stays as the SDK alone installs it)."""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_SDK = "sie-sdk==0.10.1"
# Under .pytest_cache (ignored by git, hidden from tests/test_docs.py's look at the top-level folders).
VENV = ROOT / ".pytest_cache" / "reference-sdk" / "sie-sdk-0.10.1"


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
