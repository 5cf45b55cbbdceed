"""The service images pass signals on from their first moment: PID 1 of a container gets no signal it has not set a
handler for, and a service sets its SIGTERM handler only once it has imported (torch and transformers take the worker
10-20 s). An outside attack stopped a worker container 3 s into its start: the SIGTERM was lost, the worker came up,
served, and was SIGKILLed at the stop's timeout (in a pod: in the middle of the requests it had taken by then). The
images now run each service under dumb-init, which passes each signal on to it."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from container_images import build_images, engine_or_skip
from sie_stack.containers import IMAGES
from worker_process import free_port

pytestmark = [pytest.mark.process, pytest.mark.slow]

ENGINE = engine_or_skip()
SERVICES = ("config", "gateway", "worker")


@pytest.fixture(scope="module")
def images() -> list[str]:
    return build_images()


def entrypoint(image: str) -> list[str]:
    inspected = subprocess.run(
        [ENGINE.binary, "image", "inspect", "--format", "{{json .Config.Entrypoint}}", image],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(inspected.stdout)


def running(name: str) -> bool:
    state = subprocess.run(
        [ENGINE.binary, "inspect", "--format", "{{.State.Running}}", name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return state.stdout.strip() == "true"


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_runs_under_an_init_that_passes_signals_on(images, service: str) -> None:
    assert entrypoint(IMAGES[f"sie_{service}"]) == ["dumb-init", "--single-child", "--", f"sie-{service}"]


def test_a_worker_stopped_while_it_starts_stops_at_once(images) -> None:
    port = free_port()
    name = f"sie-worker-signals-{port}"
    started = subprocess.Popen(
        [ENGINE.binary, "run", "--rm", "--name", name, "--network", "host", *ENGINE.run_flags(),
         "--env", "SIE_HOST=127.0.0.1", "--env", f"SIE_PORT={port}", "--env", f"SIE_WORKER_METRICS_PORT={free_port()}",
         IMAGES["sie_worker"], "serve"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not running(name):
            assert started.poll() is None and time.monotonic() < deadline, "the worker container did not start"
            time.sleep(0.2)
        time.sleep(2)  # into its imports: torch alone takes longer
        began = time.monotonic()
        stop = subprocess.run(
            [ENGINE.binary, "stop", "--time", "30", name], capture_output=True, text=True, timeout=90, check=False
        )
        took_s = time.monotonic() - began
        assert stop.returncode == 0, stop.stderr
        assert took_s < 15, f"the stop took {took_s:.1f} s: the SIGTERM was lost and the worker was killed"
        assert "resorting to SIGKILL" not in stop.stderr
        assert started.wait(30) != 137
    finally:
        started.kill()
        subprocess.run([ENGINE.binary, "rm", "--force", name], capture_output=True, timeout=60, check=False)
