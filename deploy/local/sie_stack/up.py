"""`sie up`: the whole stack on loopback, until Ctrl-C, SIGTERM or SIGHUP.

etcd -> config service (default bundle, the demo model added) -> workers ->
gateway -> Envoy. Every process logs to <state dir>/logs. The start-up runs on
a thread of its own, so a signal stops the stack at any point, start-up
included: every process started so far is stopped (all together, etcd last),
a start-up still running is refused further processes, and none is left
running. That thread lasts as long as the stack: Envoy gets SIGTERM when the
thread that started it ends (the kernel's parent-death signal is per thread).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import logging
import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import yaml

from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc
from sie_common.cluster.config_messages import config_to_message
from sie_common.cluster.etcd_access import CONFIG_USER, GATEWAY_USER
from sie_common.cluster.model_config import ModelConfig, parse_model_config
from sie_common.edge.auth import bearer_metadata
from sie_stack.containers import ContainerEngine, StackContainers
from sie_stack.envoy_config import render
from sie_stack.etcd_credentials import StackEtcdCredentials, worker_user
from sie_stack.etcd_tls import StackEtcdTls
from sie_stack.processes import (
    ChildProcess,
    EnvoyProcess,
    EtcdProcess,
    ServiceProcess,
    Standby,
    free_port,
    port_in_use,
)
from sie_stack.settings import StackSettings
from sie_stack.supervisor import Supervisor

log = logging.getLogger("sie_stack")

DEMO_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# How long a stop waits for a start-up still running to notice that its processes are gone.
START_UP_EXIT_S = 10.0


class StackStopping(Exception):
    """The stack is coming down: no process may be started."""


class StartedProcesses:
    """The processes a stack started, in start order. Once closed (the stack is coming down), a process added is
    stopped at once and StackStopping raised, so a start-up running on another thread leaves none behind."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._processes: list[ChildProcess] = []
        self._closed = False

    def append(self, process: ChildProcess) -> None:
        with self._lock:
            if not self._closed:
                self._processes.append(process)
                return
        process.stop()
        raise StackStopping(f"not starting {process.log_path.stem}: the stack is stopping")

    def close(self) -> list[ChildProcess]:
        """Refuse processes from now on; those started so far."""
        with self._lock:
            self._closed = True
            return list(self._processes)

    def __iter__(self) -> Iterator[ChildProcess]:
        with self._lock:
            return iter(list(self._processes))


class Stack:
    def __init__(self, settings: StackSettings) -> None:
        self.settings = settings
        self.state = Path(settings.state_dir).resolve()
        self.logs = self.state / "logs"
        self.started = StartedProcesses()
        self.services: list[ServiceProcess] = []
        # Admin writes always need a token: the operator's, or one made for this session (kept in this file).
        self.admin_token = settings.admin_token or secrets.token_urlsafe(24)
        self.admin_token_file = None if settings.admin_token else self.state / "admin-token"
        # The gateway presents it on its Work streams; the workers refuse streams without it.
        self.worker_token = secrets.token_urlsafe(24)
        # etcd has authentication on; each service signs in as its own user (etcd_credentials.py), over TLS
        # with the run's client certificate (etcd_tls.py).
        self.worker_ids = [f"worker-{index}" for index in range(settings.workers)]
        self.etcd_credentials = StackEtcdCredentials(
            self.state / "etcd-credentials", settings.etcd_prefix, self.worker_ids
        )
        self.etcd_tls = StackEtcdTls(self.state / "etcd-tls")
        self.standby: Standby | None = None
        # --images: the services and Envoy run from their images (containers.py).
        self.containers = (
            StackContainers(ContainerEngine.find(settings.container_engine), self.state) if settings.images else None
        )

    def up(self) -> None:
        """Start every process and wait until a request through Envoy can be served."""
        s = self.settings
        taken = [f"{port} for {what}" for port, what in s.ports().items() if port_in_use(port)]
        if taken:
            raise RuntimeError(
                f"ports already in use on 127.0.0.1: {', '.join(taken)}. Another `sie up` or an orphaned process "
                "holds them; stop it, or move this stack with the flags named"
            )
        if self.containers is not None:
            self.containers.check_images()
        self.logs.mkdir(parents=True, exist_ok=True)
        # etcd takes connections only with the run's client certificate, and requests only from its users.
        self.etcd_tls.create()
        etcd = EtcdProcess(self.state / "etcd", self.logs / "etcd.log", client_port=s.etcd_port, tls=self.etcd_tls)
        self.started.append(etcd)
        self.etcd_credentials.set_up(etcd)
        etcd.start()
        env = {
            "SIE_ETCD_ENDPOINTS": etcd.endpoint,
            "SIE_ETCD_PREFIX": s.etcd_prefix,
            **self.etcd_tls.env(),
            "SIE_LOG_LEVEL": s.log_level,
        }
        if self.admin_token_file is not None:
            self.admin_token_file.unlink(missing_ok=True)
            with os.fdopen(os.open(self.admin_token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
                file.write(self.admin_token + "\n")
        config = self._service(
            "sie_config",
            s.config_port,
            {**env, **self.etcd_credentials.env(CONFIG_USER), "SIE_ADMIN_TOKEN": self.admin_token},
        )
        with grpc.insecure_channel(config.address) as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            wait_for_leader(admin)
            request = config_pb2.AddModelRequest(config=config_to_message(demo_model_config()))
            admin.AddModel(request, timeout=30, metadata=bearer_metadata(self.admin_token))
        # Gateways and workers check the same inference tokens; Work streams carry the stack's worker token.
        inference = {
            "SIE_AUTH_MODE": s.auth_mode,
            "SIE_AUTH_TOKENS": ",".join(s.auth_tokens),
            "SIE_WORKER_TOKEN": self.worker_token,
        }
        workers = [
            self._service(
                "sie_worker",
                s.worker_port + index,
                {
                    **env,
                    **self.etcd_credentials.env(worker_user(worker_id)),
                    **inference,
                    "SIE_WORKER_ID": worker_id,
                    "SIE_PRELOAD_MODELS": DEMO_MODEL,
                },
                log_name=worker_id,
            )
            for index, worker_id in enumerate(self.worker_ids)
        ]
        adapter_port = s.http_adapter_port or free_port()  # the gateway's HTTP adapter, behind Envoy
        gateway = self._service(
            "sie_gateway",
            s.gateway_port,
            {**env, **self.etcd_credentials.env(GATEWAY_USER), **inference, "SIE_GATEWAY_HTTP_PORT": str(adapter_port)},
        )
        envoy_config = self.state / "envoy.json"
        envoy_config.write_text(
            json.dumps(
                render(
                    listen_port=s.http_port,
                    admin_port=s.envoy_admin_port,
                    gateway=gateway.address,
                    config=config.address,
                    adapter=f"127.0.0.1:{adapter_port}",
                    inline_descriptor=self.containers is not None,  # a container does not see this machine's files
                ),
                indent=2,
            )
        )
        envoy = (
            self.containers.envoy(envoy_config, self.logs / "envoy.log", s.http_port, s.envoy_admin_port)
            if self.containers is not None
            else EnvoyProcess(envoy_config, self.logs / "envoy.log", s.envoy_admin_port)
        )
        self.started.append(envoy)
        envoy.wait_ready()
        _wait_until_served(gateway.address, bearer_metadata(s.auth_tokens[0]) if s.auth_mode == "static" else ())
        # A crashed worker is replaced by a process that has done its imports (standby.py); not a container's.
        if workers and self.containers is None:
            self.standby = Standby("sie_worker", workers[0].env, self.state / "worker-standby.ready")
            for worker in workers:
                worker.standby = self.standby

    def _service(self, module: str, port: int, env: dict[str, str], log_name: str | None = None) -> ServiceProcess:
        log_path = self.logs / f"{log_name or module}.log"
        process = (
            self.containers.service(module, port, env, log_path)
            if self.containers is not None
            else ServiceProcess(env, log_path, module=module, port=port)
        )
        self.started.append(process)
        self.services.append(process)
        process.wait_serving()
        return process

    def down(self) -> None:
        """Stop every process started so far, and refuse new ones: etcd last, all the others together (each
        drains while the others do; the services deregister through etcd on their way out)."""
        processes = self.started.close()
        etcd = [process for process in processes if isinstance(process, EtcdProcess)]
        others: list[Callable[[], object]] = [process.stop for process in processes if process not in etcd]
        if self.standby is not None:
            others.append(self.standby.stop)
        if others:
            with ThreadPoolExecutor(max_workers=len(others)) as pool:
                list(pool.map(lambda stop: stop(), others))
        for process in etcd:
            process.stop()

    def banner(self) -> str:
        s = self.settings
        # With inference tokens, the curl lines send the first of SIE_AUTH_TOKENS (read from the shell, not printed).
        token = ' -H "authorization: Bearer ${SIE_AUTH_TOKENS%%,*}"' if s.auth_mode == "static" else ""
        workers = ", ".join(f"127.0.0.1:{s.worker_port + i}" for i in range(s.workers))
        return (
            "SIE is up.\n"
            f"  HTTP/JSON and gRPC  http://127.0.0.1:{s.http_port}   (Envoy)\n"
            f"  gateway (gRPC)      127.0.0.1:{s.gateway_port}\n"
            f"  config (gRPC)       127.0.0.1:{s.config_port}\n"
            f"  workers (gRPC)      {workers}\n"
            f"  etcd                127.0.0.1:{s.etcd_port}   (client certificates in {self.etcd_tls.directory}; "
            f"users' passwords in {self.etcd_credentials.directory})\n"
            f"  metrics             {self._metrics_endpoints()}   (/metrics, /healthz, /readyz)\n"
            f"  state and logs      {self.state}\n"
            f"{f'  images              {self.containers.description()}{chr(10)}' if self.containers else ''}"
            f"{self._token_lines()}"
            "Try:\n"
            f'  curl -s{token} http://127.0.0.1:{s.http_port}/v1/encode/{DEMO_MODEL} -d \'{{"items": [{{"text": '
            f'"hello"}}]}}\'\n'
            f'  curl -s{token} http://127.0.0.1:{s.http_port}/v1/embeddings -d \'{{"model": "{DEMO_MODEL}", '
            f'"input": "hello"}}\'\n'
            "Ctrl-C stops everything."
        )

    def _token_lines(self) -> str:
        """Which tokens the stack wants, for the banner (a token made for this session is shown)."""
        where = (
            f"{self.admin_token}   (kept in {self.admin_token_file})" if self.admin_token_file else "SIE_ADMIN_TOKEN"
        )
        lines = f"  admin token         {where}: AddModel and config reads need 'authorization: Bearer <token>'\n"
        if self.settings.auth_mode == "static":
            lines += (
                "  inference tokens    SIE_AUTH_TOKENS: every Inference call needs 'authorization: Bearer <token>'\n"
            )
        return lines

    def _metrics_endpoints(self) -> str:
        """`name :port` of each service's metrics port (config, workers, gateway), in start order."""
        names = {"sie_config": "config", "sie_gateway": "gateway"}
        return (
            ", ".join(
                f"{names.get(p.module, p.log_path.stem)} :{p.metrics_port}" for p in self.services if p.metrics_port
            )
            or "off"
        )


def run(settings: StackSettings) -> int:
    """Bring the stack up, print where it is, restart what exits (supervisor.py), and bring it down on
    Ctrl-C / SIGTERM / SIGHUP, during start-up too (then quietly: what the start-up was waiting for failed
    because the stack is stopping, not because of an error)."""
    stack = Stack(settings)
    stopping = threading.Event()
    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # one the caller ignores stays ignored (nohup: SIGHUP)
            signal.signal(signum, lambda signum, frame: stopping.set())
    failures: list[BaseException] = []
    over = threading.Event()  # the start-up is over: done or failed

    def start_up() -> None:
        try:
            stack.up()
        except BaseException as error:  # noqa: BLE001 -- reported by the main thread, unless the stack is stopping
            failures.append(error)
        finally:
            over.set()
        stopping.wait()  # Envoy ends with the thread that started it

    starting = threading.Thread(target=start_up, name="sie-up-start", daemon=True)
    starting.start()
    try:
        while not over.wait(0.2) and not stopping.is_set():
            pass
        if stopping.is_set():
            return 0
        if failures:
            return _start_up_failed(failures[0])
        _say(stack.banner())
        supervisor = Supervisor(list(stack.started))
        while not stopping.wait(0.2):
            supervisor.check()
        return 0
    finally:
        stopping.set()
        _say("stopping...")
        began = time.monotonic()
        stack.down()
        starting.join(START_UP_EXIT_S)  # refused further processes, it ends once what it waits for is gone
        stack.down()  # whatever it started meanwhile
        log.info("stopped every process in %.1f s", time.monotonic() - began)


def _say(text: str) -> None:
    """Print `text`; a terminal or pipe that went away does not keep the stack from stopping."""
    with contextlib.suppress(OSError):
        print(text, flush=True)


def _start_up_failed(error: BaseException) -> int:
    """Log why the stack did not come up (a gRPC error by its code and message, not its debug dump); 1."""
    if isinstance(error, grpc.RpcError) and isinstance(error, grpc.Call):
        log.error("the stack did not come up: %s: %s", error.code().name, error.details())
    elif isinstance(error, (RuntimeError, TimeoutError, OSError, grpc.RpcError)):
        log.error("the stack did not come up: %s", error)
    else:
        raise error
    return 1


def demo_model_config() -> ModelConfig:
    """The worker's built-in demo config (weights from the bundled package when offline): read as package data,
    not through the worker's catalog, which imports torch (seconds to import, and seconds more for this process
    to exit)."""
    path = importlib.resources.files("sie_worker") / "builtin_models" / "all-MiniLM-L6-v2.yaml"
    return parse_model_config(yaml.safe_load(path.read_text()), source=str(path))


def wait_for_leader(stub: config_pb2_grpc.ConfigServiceStub, timeout_s: float = 30) -> None:
    """A config leader has published the bundles once ListBundles shows them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stub.ListBundles(config_pb2.ListBundlesRequest(), timeout=5).bundles:
            return
        time.sleep(0.2)
    raise TimeoutError("no config leader published the bundles")


def _wait_until_served(gateway: str, metadata: tuple[tuple[str, str], ...], timeout_s: float = 180) -> None:
    """Until a worker has registered with the demo model loaded (`metadata`: the inference token, if one is needed)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        while time.monotonic() < deadline:
            if stub.GetModel(
                inference_pb2.GetModelRequest(model=DEMO_MODEL), timeout=5, metadata=metadata
            ).model.loaded_on:
                return
            time.sleep(0.2)
    raise TimeoutError(f"no worker registered {DEMO_MODEL} as loaded within {timeout_s} s")
