"""An OMP_WAIT_POLICY or GOMP_SPINCOUNT that libgomp cannot read (empty, a typo) is refused when the worker starts,
naming the values it reads. libgomp ignores such a value (a line on stderr) and its idle threads spin, the thing the
worker sets PASSIVE to avoid; the worker used to take any value as the operator's choice and start spinning.

The worker's reading of both variables is checked against libgomp's own: the libgomp torch ships is loaded with each
value and says whether it took it."""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sie_common.runtime.settings import SettingsError
from sie_worker.cli import idle_openmp_threads_sleep
from worker_process import free_port

pytestmark = pytest.mark.process

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
# (variable, value): what operators type, what libgomp takes at the edges of its grammar, and what it does not.
VALUES = [
    ("OMP_WAIT_POLICY", ""),
    ("OMP_WAIT_POLICY", " "),
    ("OMP_WAIT_POLICY", "fast"),
    ("OMP_WAIT_POLICY", "PASSIVE"),
    ("OMP_WAIT_POLICY", " passive\t"),
    ("OMP_WAIT_POLICY", "Active"),
    ("OMP_WAIT_POLICY", "activex"),
    ("OMP_WAIT_POLICY", "active passive"),
    ("OMP_WAIT_POLICY", "PASSIVE,"),
    ("GOMP_SPINCOUNT", ""),
    ("GOMP_SPINCOUNT", "0"),
    ("GOMP_SPINCOUNT", " 10k "),
    ("GOMP_SPINCOUNT", "10 M"),
    ("GOMP_SPINCOUNT", "+5"),
    ("GOMP_SPINCOUNT", "-1"),
    ("GOMP_SPINCOUNT", "INFINITE"),
    ("GOMP_SPINCOUNT", "infinity "),
    ("GOMP_SPINCOUNT", "5x"),
    ("GOMP_SPINCOUNT", "10kk"),
    ("GOMP_SPINCOUNT", "1.5"),
    ("GOMP_SPINCOUNT", "18446744073709551615"),
    ("GOMP_SPINCOUNT", "18446744073709551616"),
    ("GOMP_SPINCOUNT", "lots"),
]


def _libgomp() -> str:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.submodule_search_locations
    found = glob.glob(os.path.join(spec.submodule_search_locations[0], "lib", "libgomp*.so*"))
    assert found, "torch ships no libgomp"
    return found[0]


def _clean_env(**given: str) -> dict[str, str]:
    return {**{key: value for key, value in os.environ.items() if key not in WAIT_VARIABLES}, **given}


def libgomp_takes(name: str, value: str) -> bool:
    """Whether torch's libgomp reads `value` of `name` (it reports one it cannot on stderr as it loads)."""
    loaded = subprocess.run(
        [sys.executable, "-c", f"import ctypes; ctypes.CDLL({_libgomp()!r})"],
        env=_clean_env(**{name: value}),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return f"Invalid value for environment variable {name}" not in loaded.stderr


def worker_takes(name: str, value: str) -> bool:
    environ = {name: value}
    try:
        idle_openmp_threads_sleep(environ)
    except SettingsError:
        return False
    assert environ == {name: value}, "the operator's choice is kept as given"
    return True


def test_the_worker_reads_the_wait_variables_as_libgomp_does() -> None:
    assert libgomp_takes("OMP_WAIT_POLICY", "PASSIVE") and not libgomp_takes("OMP_WAIT_POLICY", "fast")
    disagree = [(name, value) for name, value in VALUES if worker_takes(name, value) != libgomp_takes(name, value)]
    assert disagree == []


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("OMP_WAIT_POLICY", "", "set ACTIVE or PASSIVE (any case)"),
        ("OMP_WAIT_POLICY", "fast", "set ACTIVE or PASSIVE (any case)"),
        ("GOMP_SPINCOUNT", "lots", "set a count of spins (e.g. 0, 10000, 10k) or INFINITE"),
    ],
)
def test_a_worker_given_a_value_libgomp_cannot_read_refuses_to_start(tmp_path: Path, name: str, value: str, said: str) -> None:
    started = time.monotonic()
    worker = subprocess.run(
        [sys.executable, "-m", "sie_worker", "serve"],
        env=_clean_env(
            **{name: value}, SIE_HOST="127.0.0.1", SIE_PORT=str(free_port()), SIE_MODELS_DIR=str(tmp_path), SIE_WORKER_METRICS_PORT="0"
        ),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert worker.returncode == 2, worker.stderr[-2000:]
    line = f"sie-worker: error: {name}={value!r}: libgomp would ignore it and let idle threads spin; {said}"
    assert line in worker.stderr and "Traceback" not in worker.stderr, worker.stderr[-2000:]
    assert "unset it (the worker then sets OMP_WAIT_POLICY=PASSIVE)" in worker.stderr
    assert time.monotonic() - started < 60, "refused before torch loads"
