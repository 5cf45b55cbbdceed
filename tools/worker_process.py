"""Start a real `sie-worker serve` (or `sie-config serve`) process on a free loopback port and wait until it serves (tests, benchmarks)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WorkerProcess:
    """A service process; `module` picks the service (`sie_worker`, `sie_config`)."""

    def __init__(self, env: Mapping[str, str], log_path: Path, args: tuple[str, ...] = (), module: str = "sie_worker") -> None:
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = log_path
        self.module = module
        full_env = {**os.environ, "SIE_HOST": "127.0.0.1", "SIE_PORT": str(self.port), **env}
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "serve", *args],
            env=full_env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_serving(self, timeout_s: float = 180) -> None:
        deadline = time.monotonic() + timeout_s
        with grpc.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"{self.module} exited with {self.process.returncode}:\n{self.log()}")
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        raise TimeoutError(f"{self.module} not serving after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown (no lease revoked, no stream closed)."""
        self.process.kill()
        self.process.wait()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return self.process.returncode
