"""Every etcd connection fails over between SIE_ETCD_ENDPOINTS (issue 32).

A connection used to stay on the first endpoint that answered: when that member died, the gateway's mirrors stopped
seeing new workers and configs and the config service stopped writing, though the other two members of the cluster
served. Now a call that fails as if its member were gone drops the connection, the next call or watch goes to the
next endpoint that answers, and a watch resumes from the revision after the last one seen.

A real three-member etcd cluster on loopback; its first member (the first endpoint everyone is given) is killed.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from grpc_helpers import encode_request
from local_cluster import Cluster, gateway_model, model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2_grpc
from sie_common.cluster.cluster_store import WORKERS, decode_worker
from sie_common.cluster.etcd import WATCH_PROBE_S, Etcd, EtcdUnavailable
from sie_common.cluster.etcd_mirror import MirrorUpdate, PrefixMirror
from sie_stack.processes import ETCD_BINARY, ChildProcess, free_port

MEMBERS = 3
pytestmark = pytest.mark.process


class EtcdMember(ChildProcess):
    """One member of a loopback etcd cluster (peers over loopback TCP: a test cluster only)."""

    def __init__(self, root: Path, name: str, cluster: str, client_port: int, peer_port: int) -> None:
        super().__init__(root / f"{name}.log")
        self.name = name
        self.endpoint = f"127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn([
            str(ETCD_BINARY), "--name", name, "--data-dir", str(root / name),
            "--listen-client-urls", f"http://{self.endpoint}", "--advertise-client-urls", f"http://{self.endpoint}",
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", cluster, "--initial-cluster-state", "new", "--log-level", "warn",
        ])  # fmt: skip


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[EtcdMember]]:
    ports = [(free_port(), free_port()) for _ in range(MEMBERS)]
    cluster = ",".join(f"m{n}=http://127.0.0.1:{peer}" for n, (_, peer) in enumerate(ports))
    started = [EtcdMember(tmp_path, f"m{n}", cluster, client, peer) for n, (client, peer) in enumerate(ports)]
    try:
        for member in started:
            member._wait(lambda member=member: _answers(member.endpoint), timeout_s=60)
        yield started
    finally:
        for member in started:
            member.kill()


def _answers(endpoint: str) -> bool:
    async def probe() -> bool:
        etcd = Etcd([endpoint], timeout_s=1)
        try:
            await etcd.connect()
            await etcd.put("probe", b"1")
            return True
        except EtcdUnavailable:
            return False
        finally:
            await etcd.close()

    return asyncio.run(probe())


async def _put(etcd: Etcd, name: str, deadline_s: float = 30) -> int:
    """A write, retried on EtcdUnavailable as callers do: while the cluster elects a new leader after losing its
    leader, or right after the member the writer was on was lost, writes fail."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await etcd.put(name, b"x")
        except EtcdUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_a_mirror_and_calls_go_on_at_the_next_member_without_missing_or_repeating_a_change(members) -> None:
    endpoints = [member.endpoint for member in members]
    watcher = Etcd(endpoints, "/failover/", timeout_s=2)
    writer = Etcd(endpoints[1:], "/failover/")
    await watcher.connect()
    await writer.connect()
    seen: list[tuple[str, int]] = []

    def apply(update: MirrorUpdate) -> None:
        seen.extend((change.name, change.revision) for change in update.changes)

    mirror = PrefixMirror(watcher, "keys/", apply, retry_s=0.1)
    try:
        await mirror.start()
        for n in range(5):
            await writer.put(f"keys/before-{n}", b"x")
        members[0].kill()  # the member the watcher is on
        for n in range(20):
            await _put(writer, f"keys/after-{n}")
            await asyncio.sleep(0.02)
        last = await _put(writer, "keys/last")
        await mirror.wait_for(last, timeout_s=20)
        # A read right after the loss goes to the next member at once; a write does once its caller retries.
        assert (await watcher.get("keys/last")) is not None
        await _put(watcher, "keys/from-watcher")
        assert (await writer.get("keys/from-watcher")) is not None
    finally:
        await mirror.stop()
        await watcher.close()
        await writer.close()
    names = [name for name, _ in seen]
    expected = [f"before-{n}" for n in range(5)] + [f"after-{n}" for n in range(20)] + ["last"]
    assert names[: len(expected)] == expected, "a change was missed, repeated or reordered across the failover"
    revisions = [revision for _, revision in seen]
    assert revisions == sorted(set(revisions))
    assert mirror.state.keys() >= set(expected)
    assert mirror.full_reads == 1  # resumed from the last revision, not read again


def _add_model(admin: config_pb2_grpc.ConfigServiceStub, config: dict, deadline_s: float = 30) -> None:
    """AddModel, retried while the config service answers UNAVAILABLE (as a client does on ETCD_UNAVAILABLE)."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            admin.AddModel(config_pb2.AddModelRequest(config=config), timeout=10)
            return
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_gateway_and_config_service_go_on_when_the_first_member_dies(
    members, tmp_path, etcd_prefix, tiny_models, start_config
) -> None:
    endpoints = ",".join(member.endpoint for member in members)
    cluster = Cluster(
        tmp_path,
        endpoints,
        etcd_prefix,
        [model_config("test/tiny-mean", tiny_models["test/tiny-mean"])],
        lambda: start_config(SIE_ETCD_ENDPOINTS=endpoints),
    )
    try:
        first = cluster.start_worker("w1", SIE_PRELOAD_MODELS="test/tiny-mean")
        gateway = cluster.start_gateway()
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            wait_until(lambda: tuple(gateway_model(stub, "test/tiny-mean").loaded_on) == ("w1",), what="w1 warm")
            members[0].kill()
            # The config service still writes: a model added after the loss...
            with grpc.insecure_channel(cluster.config.address) as admin_channel:
                admin = config_pb2_grpc.ConfigServiceStub(admin_channel)
                _add_model(admin, model_config("test/tiny-cls", tiny_models["test/tiny-cls"]))
            # ...is seen by the gateway, and so is a worker that registers after the loss; the first one leaves.
            cluster.start_worker("w2", SIE_PRELOAD_MODELS="test/tiny-cls,test/tiny-mean")
            first.process.send_signal(signal.SIGTERM)
            assert first.process.wait(timeout=60) == 0
            wait_until(
                lambda: _workers(members[1].endpoint, etcd_prefix) == {"w2"}, what="only w2 registered", timeout_s=30
            )
            for model in ("test/tiny-cls", "test/tiny-mean"):
                wait_until(
                    lambda model=model: tuple(gateway_model(stub, model).loaded_on) == ("w2",),
                    what=f"the gateway to see {model} warm on the new worker",
                    timeout_s=30,
                )
                response, call = stub.Encode.with_call(encode_request(model, ["after the loss"]), timeout=60)
                assert dict(call.trailing_metadata())["x-sie-worker"] == "w2"
                assert len(response.results) == 1
    finally:
        cluster.stop()


def _workers(endpoint: str, prefix: str) -> set[str]:
    async def read() -> set[str]:
        etcd = Etcd([endpoint], prefix)
        await etcd.connect()
        try:
            entries, _ = await etcd.read_prefix(WORKERS)
        finally:
            await etcd.close()
        return {decode_worker(entry.value).worker_id for entry in entries}

    return asyncio.run(read())


async def test_a_watch_on_a_frozen_member_moves_to_the_next(members) -> None:
    """A frozen member (SIGSTOP: the connection stays open, nothing answers) ends no stream by itself: the watch's
    progress requests find it out, and the mirror resumes at the next member."""
    endpoints = [member.endpoint for member in members]
    watcher = Etcd(endpoints, "/frozen/", timeout_s=2)
    writer = Etcd(endpoints[1:], "/frozen/")
    await watcher.connect()
    await writer.connect()
    mirror = PrefixMirror(watcher, "keys/", retry_s=0.1)
    try:
        await mirror.start()
        assert members[0].process is not None
        members[0].process.send_signal(signal.SIGSTOP)
        last = 0
        for n in range(5):
            last = await _put(writer, f"keys/{n}")
        started = time.monotonic()
        await mirror.wait_for(last, timeout_s=30)
        # Found out by the first progress request after the freeze (every WATCH_PROBE_S) going unanswered.
        assert time.monotonic() - started < WATCH_PROBE_S + 2 + 10
        assert set(mirror.state) == {f"{n}" for n in range(5)}
        assert mirror.full_reads == 1
    finally:
        await mirror.stop()
        await watcher.close()
        await writer.close()
