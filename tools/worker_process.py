"""Service launchers for tests and benchmarks (they live in sie_stack, which `sie up` uses too), the processes one
test module or session started, and the ports they take."""

from __future__ import annotations

import functools
import os
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from sie.v1 import inference_pb2_grpc
from sie_stack.processes import ServiceProcess as WorkerProcess
from sie_stack.processes import port_in_use

__all__ = [
    "Services",
    "WorkerProcess",
    "consecutive_free_ports",
    "free_port",
    "inference_stub",
    "stop_all",
]


class Stoppable(Protocol):
    def stop(self) -> object: ...


P = TypeVar("P", bound=Stoppable)


@contextmanager
def inference_stub(worker: WorkerProcess) -> Iterator[inference_pb2_grpc.InferenceStub]:
    with grpc.insecure_channel(worker.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


def stop_all(processes: Iterable[Stoppable]) -> None:
    """Stop the processes together: each one's shutdown (its drain) overlaps the others' instead of following them."""
    processes = list(processes)
    if processes:
        with ThreadPoolExecutor(max_workers=len(processes)) as pool:
            list(pool.map(lambda process: process.stop(), processes))


class Services:
    """The processes one owner (a test module, the test session, a benchmark) started, stopped together by `stop`.

    Each service logs to its own file under `logs`, named after it."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._lock = threading.Lock()
        self._names: Counter[str] = Counter()
        self.processes: list[Stoppable] = []

    def log_path(self, name: str) -> Path:
        """A log file of its own for a service called `name` (name.log, then name-1.log, ...)."""
        with self._lock:
            number = self._names[name]
            self._names[name] += 1
        self._logs.mkdir(parents=True, exist_ok=True)
        return self._logs / (f"{name}.log" if number == 0 else f"{name}-{number}.log")

    def start(self, env: Mapping[str, str], name: str = "worker", **options: Any) -> WorkerProcess:
        """`python -m <module> serve` (options: module= sie_worker by default, port=, args=, credentials=), not
        waited for: call its wait_serving() (several started first start up together)."""
        return self.keep(WorkerProcess(env, self.log_path(name), **options))

    def worker(
        self, env: Mapping[str, str], name: str = "worker", timeout_s: float = 180, **options: Any
    ) -> WorkerProcess:
        """A service (a worker unless module= says otherwise) started with `env`, once it reports SERVING."""
        service = self.start(env, name, **options)
        service.wait_serving(timeout_s=timeout_s)
        return service

    def keep(self, process: P) -> P:
        """Stop `process` (started some other way: etcd, Envoy, a moto server) with the rest."""
        with self._lock:
            self.processes.append(process)
        return process

    def stop(self) -> None:
        with self._lock:
            processes, self.processes = self.processes, []
        stop_all(processes)


# Ports: each pytest-xdist worker (and a run without xdist) takes the ports of the services it starts from a block of
# its own below the kernel's ephemeral range, one after another. A port handed out is not handed out again until the
# block wraps round, so neither another xdist worker nor an outgoing connection (whose local port is ephemeral) can
# take it between the moment it is picked and the moment the service started on it binds it.
LOWEST_PORT = 10000
BLOCK_PORTS = 400


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class PortBlock:
    """Consecutive ports of one block, handed out in turn, each checked to be free when handed out."""

    def __init__(self, index: int, run_id: str, ephemeral_low: int) -> None:
        """Block `index` of a run: a run's workers take consecutive blocks from one that `run_id` picks, so two
        runs on one host most likely take different ones."""
        blocks = max(1, (ephemeral_low - LOWEST_PORT) // BLOCK_PORTS)
        block = (int(uuid.uuid5(uuid.NAMESPACE_OID, run_id).hex[:8], 16) + index) % blocks
        self.first = LOWEST_PORT + block * BLOCK_PORTS
        self._next = int(uuid.uuid5(uuid.NAMESPACE_OID, f"{run_id}/{index}").hex[:8], 16) % BLOCK_PORTS
        self._lock = threading.Lock()

    def take(self, count: int = 1) -> int:
        """The first of `count` consecutive free ports."""
        with self._lock:
            for _ in range(BLOCK_PORTS):
                start = self._next if self._next + count <= BLOCK_PORTS else 0
                self._next = (start + count) % BLOCK_PORTS
                ports = range(self.first + start, self.first + start + count)
                if not any(port_in_use(port) for port in ports):
                    return ports[0]
        raise RuntimeError(f"no {count} consecutive free ports in {self.first}-{self.first + BLOCK_PORTS - 1}")


@functools.cache
def _block() -> PortBlock:
    """This process's block (read on first use: pytest-xdist names the worker in its environment)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"{os.getpid()}-{uuid.uuid4().hex}"
    return PortBlock(index, run_id, _ephemeral_low())


def free_port() -> int:
    """A port nothing listens on, from this process's block."""
    return _block().take()


def consecutive_free_ports(count: int) -> int:
    """The first of `count` consecutive free ports (`sie up` gives its workers consecutive ports)."""
    return _block().take(count)
