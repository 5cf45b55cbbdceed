"""A `sie up` the tests start on free ports: its banner, its state dir, and raw etcd calls against its etcd.

The etcd calls go straight to etcd's gRPC API (what `etcdctl` or an attacker on
the host would send), not through the engine's client, so a test sees exactly
what etcd lets through.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from stack_process import stop_stack
from worker_process import consecutive_free_ports, free_port

BANNER_END = "Ctrl-C stops everything."
PREFIX = "/sie/"


@dataclass
class SieUp:
    process: subprocess.Popen
    state: Path
    output_path: Path
    ports: dict[str, int]

    @classmethod
    def start(cls, directory: Path, workers: int = 1, env: dict[str, str] | None = None) -> SieUp:
        ports = {name: free_port() for name in ("etcd", "config", "gateway", "http", "admin")}
        ports["worker"] = consecutive_free_ports(workers)  # the workers take port, port + 1, ...
        state, output = directory / "state", directory / "sie-up.out"
        command = [
            sys.executable, "-m", "sie_stack", "up", "--state-dir", str(state), "--workers", str(workers),
            "--etcd-port", str(ports["etcd"]), "--config-port", str(ports["config"]),
            "--worker-port", str(ports["worker"]), "--gateway-port", str(ports["gateway"]),
            "--http-port", str(ports["http"]), "--envoy-admin-port", str(ports["admin"]),
        ]  # fmt: skip
        with open(output, "w") as sink:
            process = subprocess.Popen(
                command, stdout=sink, stderr=subprocess.STDOUT, text=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )  # fmt: skip
        return cls(process, state, output, ports)

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def wait_up(self, timeout_s: float = 420) -> str:
        """The banner, once the stack is up."""
        deadline = time.monotonic() + timeout_s
        while BANNER_END not in self.output():
            assert self.process.poll() is None and time.monotonic() < deadline, (
                f"sie up did not come up:\n{self.output()}"
            )
            time.sleep(0.5)
        return self.output()

    def stop(self) -> None:
        stop_stack(self.process)

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.ports['gateway']}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def etcd(self) -> str:
        return f"127.0.0.1:{self.ports['etcd']}"

    @property
    def credentials(self) -> Path:
        return self.state / "etcd-credentials"

    def tls(self) -> tuple[bytes, bytes, bytes] | None:
        """(CA, client certificate, client key) of the stack's etcd; None where it has none (plaintext)."""
        directory = self.state / "etcd-tls"
        if not directory.exists():
            return None
        return tuple((directory / name).read_bytes() for name in ("ca.pem", "client.pem", "client-key.pem"))  # type: ignore[return-value]

    def password(self, user: str) -> str | None:
        """`user`'s etcd password; None where the stack keeps none (one without etcd authentication)."""
        path = self.credentials / user
        return path.read_text().strip() if path.exists() else None

    def metrics_ports(self) -> dict[str, int]:
        (line,) = [line for line in self.output().splitlines() if line.strip().startswith("metrics")]
        return {name: int(port) for name, port in re.findall(r"([\w-]+) :(\d+)", line)}


class RawEtcd:
    """etcd's own gRPC API on one channel, signed in as `user` (None: no token, as anyone on the host), over TLS
    with a client certificate when `tls` (CA, certificate, key) is given."""

    def __init__(
        self,
        endpoint: str,
        user: str | None = None,
        password: str | None = None,
        tls: tuple[bytes, bytes, bytes] | None = None,
    ) -> None:
        """Without a password, no token is sent whatever `user` says."""
        if tls is None:
            self.channel = grpc.insecure_channel(endpoint)
        else:
            ca, cert, key = tls
            credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
            self.channel = grpc.secure_channel(endpoint, credentials)
        self.kv = rpc.KVStub(self.channel)
        self.auth = rpc.AuthStub(self.channel)
        self.maintenance = rpc.MaintenanceStub(self.channel)
        self.user = user
        self.metadata: tuple[tuple[str, str], ...] = ()
        if user is not None and password is not None:
            token = self.auth.Authenticate(rpc.AuthenticateRequest(name=user, password=password), timeout=10).token
            self.metadata = (("token", token),)

    def close(self) -> None:
        self.channel.close()

    def put(self, key: str, value: bytes) -> grpc.StatusCode:
        """Write one key; OK, or the code etcd refused it with."""
        return self._status(
            lambda: self.kv.Put(rpc.PutRequest(key=key.encode(), value=value), timeout=10, metadata=self.metadata)
        )

    def delete(self, key: str) -> grpc.StatusCode:
        request = rpc.DeleteRangeRequest(key=key.encode())
        return self._status(lambda: self.kv.DeleteRange(request, timeout=10, metadata=self.metadata))

    def read(self, prefix: str = PREFIX) -> dict[str, bytes] | grpc.StatusCode:
        """Every key under `prefix`, or the code etcd refused the read with."""
        request = rpc.RangeRequest(key=prefix.encode(), range_end=prefix_range_end(prefix.encode()))
        try:
            reply = self.kv.Range(request, timeout=10, metadata=self.metadata)
        except grpc.RpcError as error:
            return error.code()
        return {kv.key.decode(): kv.value for kv in reply.kvs}

    def list_users(self) -> list[str] | grpc.StatusCode:
        try:
            return list(self.auth.UserList(rpc.AuthUserListRequest(), timeout=10, metadata=self.metadata).users)
        except grpc.RpcError as error:
            return error.code()

    def alarm(self, action: int) -> grpc.StatusCode:
        """Raise (ACTIVATE) or clear (DEACTIVATE) etcd's NOSPACE alarm on every member."""
        request = rpc.AlarmRequest(action=action, alarm=rpc.AlarmType.NOSPACE, memberID=0)
        return self._status(lambda: self.maintenance.Alarm(request, timeout=10, metadata=self.metadata))

    def alarms(self) -> list[str] | grpc.StatusCode:
        try:
            reply = self.maintenance.Alarm(
                rpc.AlarmRequest(action=rpc.AlarmRequest.GET), timeout=10, metadata=self.metadata
            )
        except grpc.RpcError as error:
            return error.code()
        return [rpc.AlarmType.Name(member.alarm) for member in reply.alarms]

    def disable_auth(self) -> grpc.StatusCode:
        return self._status(lambda: self.auth.AuthDisable(rpc.AuthDisableRequest(), timeout=10, metadata=self.metadata))

    def _status(self, call) -> grpc.StatusCode:
        try:
            call()
        except grpc.RpcError as error:
            return error.code()
        return grpc.StatusCode.OK
