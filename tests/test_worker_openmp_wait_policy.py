"""The worker's idle OpenMP threads sleep at once instead of spinning (sie_worker.cli.idle_openmp_threads_sleep),
unless the operator chose how they wait: read by libgomp itself when the worker's torch loads."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sie_worker.cli import idle_openmp_threads_sleep

# What a worker's start does before its torch loads, then libgomp's own account of its settings (on stderr).
LOAD = "import sie_worker.cli as cli; cli._load_serve(); import torch; torch.ones(1)"


def libgomp_settings(environ: dict[str, str]) -> str:
    env = {key: value for key, value in os.environ.items() if key not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    done = subprocess.run(
        [sys.executable, "-c", LOAD],
        env={**env, **environ, "OMP_DISPLAY_ENV": "VERBOSE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stderr


@pytest.mark.process
def test_a_worker_started_without_a_policy_lets_idle_threads_sleep() -> None:
    settings = libgomp_settings({})
    assert "GOMP_SPINCOUNT = '0'" in settings


@pytest.mark.process
@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ({"OMP_WAIT_POLICY": "ACTIVE"}, "OMP_WAIT_POLICY = 'ACTIVE'"),
        ({"GOMP_SPINCOUNT": "5000"}, "GOMP_SPINCOUNT = '5000'"),
    ],
)
def test_the_operators_choice_is_kept(given: dict[str, str], shown: str) -> None:
    assert shown in libgomp_settings(given)
    environ = dict(given)
    idle_openmp_threads_sleep(environ)
    assert environ == given


def test_unset_it_becomes_passive() -> None:
    environ = {"PATH": "/bin"}
    idle_openmp_threads_sleep(environ)
    assert environ == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
