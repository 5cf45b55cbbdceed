"""`sie up`: the whole stack comes up, answers curl through Envoy, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import re
import threading
import time
import urllib.request

import psutil
import pytest

from worker_process import consecutive_free_ports, free_port


def read_until(process: subprocess.Popen, marker: str, timeout_s: float) -> str:
    """Everything the process printed up to `marker` (read on a thread: a pipe read can block)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and marker not in "".join(lines) and process.poll() is None:
        time.sleep(0.2)
    seen = "".join(lines)
    assert marker in seen, f"no {marker!r} within {timeout_s} s:\n{seen}"
    return seen


@pytest.mark.process
def test_sie_up_serves_and_ctrl_c_stops_everything(tmp_path) -> None:
    ports = {name: free_port() for name in ("etcd", "config", "gateway", "http", "admin")}
    command = [
        sys.executable, "-m", "sie_stack", "up",
        "--state-dir", str(tmp_path / "state"), "--workers", "2",
        "--etcd-port", str(ports["etcd"]), "--config-port", str(ports["config"]),
        "--worker-port", str(_two_free_ports()), "--gateway-port", str(ports["gateway"]),
        "--http-port", str(ports["http"]), "--envoy-admin-port", str(ports["admin"]),
    ]
    stack = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        banner = read_until(stack, "Ctrl-C stops everything.", timeout_s=300)
        assert f"http://127.0.0.1:{ports['http']}" in banner
        children = psutil.Process(stack.pid).children(recursive=True)
        assert {"etcd", "envoy"} <= {child.name() for child in children}
        assert len([c for c in children if "sie_worker serve" in " ".join(c.cmdline())]) == 2
        assert len([c for c in children if "sie_stack.standby sie_worker" in " ".join(c.cmdline())]) == 1  # for restarts

        body = json.dumps({"items": [{"text": "hello from curl"}]})
        answer = subprocess.run(
            ["curl", "-s", f"http://127.0.0.1:{ports['http']}/v1/encode/sentence-transformers/all-MiniLM-L6-v2", "-d", body],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout
        assert len(json.loads(answer)["results"][0]["dense"]["values"]) == 384

        # Each service has its own metrics port, listed in the banner; the request was counted once on each hop.
        (metrics_line,) = [line for line in banner.splitlines() if line.strip().startswith("metrics")]
        metrics_ports = dict(re.findall(r"([\w-]+) :(\d+)", metrics_line))
        assert sorted(metrics_ports) == ["config", "gateway", "worker-0", "worker-1"]
        assert len(set(metrics_ports.values())) == 4
        ok = 'model="sentence-transformers/all-MiniLM-L6-v2",operation="encode",status="OK"'
        counted = {name: _scrape(port).count(f"_requests_total{{{ok}}} 1.0") for name, port in metrics_ports.items()}
        assert counted["gateway"] == 1 and counted["worker-0"] + counted["worker-1"] == 1

        stack.send_signal(signal.SIGINT)
        assert stack.wait(timeout=120) == 0
        gone, alive = psutil.wait_procs(children, timeout=10)
        assert alive == [], f"left running: {[p.cmdline() for p in alive]}"
    finally:
        if stack.poll() is None:  # the test failed midway: stop the stack the way a user would
            leftovers = psutil.Process(stack.pid).children(recursive=True)
            stack.send_signal(signal.SIGINT)
            try:
                stack.wait(timeout=120)
            except subprocess.TimeoutExpired:
                stack.kill()
            for child in leftovers:
                if child.is_running():
                    child.kill()


def _scrape(port: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        return reply.read().decode()


def _two_free_ports() -> int:
    """A free port whose successor is free too: `sie up` gives workers consecutive ports."""
    return consecutive_free_ports(2)
