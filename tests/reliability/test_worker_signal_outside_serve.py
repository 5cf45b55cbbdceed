"""SIGTERM and SIGINT that reach a real `python -m sie_worker serve` process outside its event loop's handlers: while
it imports torch (the first seconds of every start), and again and again while it stops (the last part of a stop is
the interpreter's teardown, after the loop and its handlers are gone). Each time the worker exits 0, without a
traceback. Before, a signal during the imports ended it with -15 (SIGINT: a KeyboardInterrupt traceback), and a
second signal during the teardown of a clean stop did the same (outside attack on SIGTERM during start)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker_process import free_port

pytestmark = pytest.mark.process


def start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "SIE_HOST": "127.0.0.1",
        "SIE_PORT": str(free_port()),
        "SIE_WORKER_METRICS_PORT": "0",
        "SIE_PRELOAD_MODELS": "",
        "SIE_MODELS_DIR": str(tmp_path / "models"),
    }
    with log.open("wb") as out:
        # The console script, as operators run it: a fresh interpreter (`python -m` would be forked from the suite's
        # zygote, torch imported already).
        command = [str(Path(sys.executable).parent / "sie-worker"), "serve"]
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    return process, log


def wait_for(condition, process: subprocess.Popen[bytes], log: Path, what: str) -> None:
    deadline = time.monotonic() + 180
    while not condition():
        assert process.poll() is None and time.monotonic() < deadline, f"{what}: {log.read_text()[-3000:]}"
        time.sleep(0.005)


def importing_torch(pid: int) -> bool:
    """torch's library is mapped: the worker is inside `import torch` (its handlers not installed yet)."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_torch_imports_stops_the_start_with_exit_0(tmp_path, signum) -> None:
    process, log = start(tmp_path)
    wait_for(lambda: importing_torch(process.pid), process, log, "torch to load")
    process.send_signal(signum)
    code = process.wait(timeout=120)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "stopped while starting" in text and "serving sie.v1.Inference" not in text, text[-3000:]


def test_signals_that_keep_coming_while_the_worker_stops_leave_its_exit_0(tmp_path) -> None:
    process, log = start(tmp_path)
    wait_for(lambda: "serving sie.v1.Inference" in log.read_text(), process, log, "the worker to serve")
    signals = 0
    while process.poll() is None:  # SIGTERM, then SIGINT and SIGTERM every 5 ms until it has exited
        try:
            process.send_signal((signal.SIGTERM, signal.SIGINT)[signals % 2])
        except ProcessLookupError:
            break
        signals += 1
        time.sleep(0.005)
    code = process.wait(timeout=60)
    text = log.read_text()
    assert signals > 10  # the teardown after the stop was covered, not only the drain
    assert code == 0, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "drained: no requests in flight" in text
