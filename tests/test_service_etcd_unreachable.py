"""A service whose etcd does not answer exits 1 with one clear line: nothing after it. The worker printed an "Event
loop is closed" traceback under its line (its gRPC server, already started, was collected after the event loop had
closed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker_process import free_port

pytestmark = pytest.mark.process


@pytest.mark.parametrize("service", ["sie_worker", "sie_gateway", "sie_config"])
def test_an_unreachable_etcd_ends_the_service_with_one_line(service: str) -> None:
    etcd = f"127.0.0.1:{free_port()}"  # nothing listens there
    env = {key: value for key, value in os.environ.items() if not key.startswith("SIE_")}
    env |= {
        "SIE_HOST": "127.0.0.1",
        "SIE_PORT": str(free_port()),
        "SIE_ETCD_ENDPOINTS": etcd,
        f"SIE_{service.removeprefix('sie_').upper()}_METRICS_PORT": "0",
    }
    result = subprocess.run(
        [sys.executable, "-m", service, "serve"], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert f"ERROR {service}: cannot reach etcd at {etcd}" in last, result.stderr[-3000:]
    for noise in ("Traceback", "Event loop is closed", "never awaited", "Exception ignored"):
        assert noise not in result.stderr, result.stderr[-3000:]
