"""The suite's services forked from a process that has imported them (tools/service_zygote.py): each one is a child
of the test process, as a spawned one is (waited for, signalled, its exit status read), with the environment,
arguments and standard streams it was given; a launch whose environment differs in a variable read at import is
spawned instead."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from service_zygote import Zygote, child_environment
from worker_process import WorkerProcess

pytestmark = pytest.mark.process

_PR_GET_CHILD_SUBREAPER = 37


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    started = Zygote()
    yield started
    started.stop()


class ForkedPopen(subprocess.Popen):
    """A Popen whose child the module's zygote forks when it can (`forked` says whether it did)."""

    zygote: Zygote

    def _execute_child(self, args, *rest):  # type: ignore[no-untyped-def]
        self.forked = self.zygote.execute_child(self, args, *rest)
        if not self.forked:
            super()._execute_child(args, *rest)  # type: ignore[misc]


@pytest.fixture
def popen(zygote: Zygote) -> type[ForkedPopen]:
    ForkedPopen.zygote = zygote
    return ForkedPopen


def cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1]


def is_subreaper() -> bool:
    flag = ctypes.c_int()
    ctypes.CDLL(None).prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)
    return bool(flag.value)


def test_an_argument_error_exits_2_with_its_message_on_the_pipes_given(popen) -> None:
    process = popen(
        [sys.executable, "-m", "sie_worker", "serve", "--no-such-flag"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    out, err = process.communicate(timeout=60)
    assert process.forked
    assert process.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in err and out == ""
    assert not is_subreaper()  # only while a launch is handed over


def test_a_forked_worker_is_a_child_of_this_process_and_serves_with_its_environment(
    popen, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").mkdir()
    monkeypatch.setattr(subprocess, "Popen", popen)  # ServiceProcess starts it through subprocess.Popen
    worker = WorkerProcess({"SIE_MODELS_DIR": str(tmp_path / "models"), "SIE_PRELOAD_MODELS": ""}, tmp_path / "w.log")
    monkeypatch.undo()
    try:
        assert worker.process is not None and worker.process.forked  # type: ignore[attr-defined]
        assert "service_zygote" in " ".join(cmdline(worker.process.pid))  # a fork, not a new interpreter
        worker.wait_serving(timeout_s=60)  # on the port its SIE_PORT names
        assert os.waitpid(worker.process.pid, os.WNOHANG) == (0, 0)  # ours to wait for, and running
        assert worker.stop() == 0  # SIGTERM: it drains and exits 0
        assert f"serving sie.v1.Inference and sie.v1.Worker on {worker.address}" in worker.log()
    finally:
        worker.kill()


def test_sigkill_reads_as_killed(popen) -> None:
    process = popen([sys.executable, "-m", "sie_config", "serve"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert process.forked
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL


def test_a_child_gets_the_environment_asked_for_and_what_the_imports_set_in_it() -> None:
    imported = {"TORCHINDUCTOR_CACHE_DIR": (None, "/tmp/inductor"), "GONE": ("x", None)}
    assert child_environment({"SIE_PORT": "1", "GONE": "x"}, imported) == {
        "SIE_PORT": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
    }  # fmt: skip
    # A value of its own (not the one the imports found) stays.
    assert child_environment({"TORCHINDUCTOR_CACHE_DIR": "/mine", "GONE": "y"}, imported) == {
        "TORCHINDUCTOR_CACHE_DIR": "/mine", "GONE": "y",
    }  # fmt: skip


def test_a_launch_with_a_variable_read_at_import_is_spawned(popen) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1"}
    process = popen(
        [sys.executable, "-m", "sie_worker", "serve", "--no-such-flag"], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert process.wait(timeout=120) == 2
    assert not process.forked


def test_a_change_of_this_process_s_own_environment_is_followed_by_a_new_zygote(
    popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library of the test process sets a variable (transformers' pipelines set TOKENIZERS_PARALLELISM): the
    launches after it still fork, from a zygote started with the new environment."""
    monkeypatch.setenv(
        "TOKENIZERS_PARALLELISM", "false" if os.environ.get("TOKENIZERS_PARALLELISM") != "false" else "true"
    )
    for _ in range(2):
        process = popen(
            [sys.executable, "-m", "sie_worker", "serve", "--no-such-flag"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert process.forked
        assert process.wait(timeout=60) == 2
