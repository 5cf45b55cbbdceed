"""The cluster the fault and load tests break: its own etcd, two config replicas, two workers, a gateway.

The gateway reaches etcd through a LinkCutter, so a test can cut its watches
off while everything else still talks to etcd. `ready()` brings back whatever
an earlier fault left dead and waits until the gateway routes to both workers.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import grpc
from local_cluster import Cluster, etcd_call, gateway_model, model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2_grpc
from sie_common.cluster.etcd import Etcd
from sie_stack.processes import EtcdProcess
from sie_stack.up import wait_for_leader
from worker_process import WorkerProcess

from reliability.link_cutter import LinkCutter

T = TypeVar("T")

MODEL = "test/tiny-mean"
PREFIX = "/sie-faults/"
WORKERS = ("w1", "w2")
# Short leases so a dead worker or leader is noticed within seconds.
LEASE_TTL_S = "3"


class FaultStack:
    def __init__(self, tmp: Path, weights: Path) -> None:
        self._tmp = tmp
        self.weights = weights
        self.etcd = EtcdProcess(tmp / "etcd-data", tmp / "etcd.log")
        self.etcd.start()
        self.configs: list[WorkerProcess] = []
        self.cluster = Cluster(tmp, self.etcd.endpoint, PREFIX, [model_config(MODEL, weights)], self.start_config)
        self.start_config()  # a follower, ready to take over
        self.etcd_link = LinkCutter(self.etcd.endpoint)
        self.workers = {name: self._start_worker(name) for name in WORKERS}
        self.gateway = self.cluster.start_gateway(SIE_ETCD_ENDPOINTS=self.etcd_link.address)

    def start_config(self) -> WorkerProcess:
        env = {
            "SIE_ETCD_ENDPOINTS": self.etcd.endpoint, "SIE_ETCD_PREFIX": PREFIX, "SIE_CONFIG_LEADER_TTL_S": LEASE_TTL_S,
            "SIE_ALLOW_UNAUTHENTICATED_ADMIN": "true",  # a loopback test stack
        }
        replica = WorkerProcess(env, self._tmp / f"config-{len(self.configs)}.log", module="sie_config")
        self.configs.append(replica)
        replica.wait_serving(timeout_s=60)
        return replica

    def _start_worker(self, name: str) -> WorkerProcess:
        return self.cluster.start_worker(name, SIE_PRELOAD_MODELS=MODEL, SIE_WORKER_LEASE_TTL_S=LEASE_TTL_S)

    def restart_gateway(self) -> None:
        self.gateway = self.cluster.start_gateway(port=self.gateway.port, SIE_ETCD_ENDPOINTS=self.etcd_link.address)

    def ready(self) -> None:
        """Every process up again (same gateway port) and the gateway routing to both workers."""
        self.etcd_link.restore()
        if self.etcd.process is None:
            self.etcd.start()
        for replica in list(self.configs):
            if not alive(replica):
                self.configs.remove(replica)
        while len(self.configs) < 2:
            self.start_config()
        for name, worker in self.workers.items():
            if not alive(worker):
                self.workers[name] = self._start_worker(name)
        if not alive(self.gateway):
            self.restart_gateway()
        with grpc.insecure_channel(self.configs[0].address) as channel:
            wait_for_leader(config_pb2_grpc.ConfigServiceStub(channel))
        with grpc.insecure_channel(self.gateway.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            wait_until(lambda: list(gateway_model(stub, MODEL).loaded_on) == list(WORKERS), timeout_s=60, what="both workers routed")

    def leader_and_follower(self) -> tuple[WorkerProcess, WorkerProcess]:
        entry = self.etcd_call(lambda etcd: etcd.get("config/leader"))
        assert entry is not None, "no config leader"
        leader = next(replica for replica in self.configs if replica.address.encode() in entry.value)
        return leader, next(replica for replica in self.configs if replica is not leader)

    def etcd_call(self, use: Callable[[Etcd], Awaitable[T]]) -> T:
        """Run `use` with a fresh client of this stack's etcd (directly, not through the link)."""
        return etcd_call(self.etcd.endpoint, PREFIX, use)

    def add_model(self, model_id: str, address: str | None = None, timeout_s: float = 10) -> config_pb2.AddModelResponse:
        with grpc.insecure_channel(address or self.leader_and_follower()[0].address) as channel:
            request = config_pb2.AddModelRequest(config=model_config(model_id, self.weights))
            return config_pb2_grpc.ConfigServiceStub(channel).AddModel(request, timeout=timeout_s)

    def stop(self) -> None:
        for worker in self.workers.values():
            if worker.process is not None and worker.process.poll() is None:
                worker.process.send_signal(signal.SIGCONT)
        self.cluster.stop()
        for replica in self.configs:
            replica.stop()
        self.etcd_link.close()
        self.etcd.stop()


def alive(process: WorkerProcess) -> bool:
    return process.process is not None and process.process.poll() is None
