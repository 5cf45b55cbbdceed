"""Two config replicas on one etcd: one leader writes, the follower points writers at it, a killed leader is replaced."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from sie.v1 import config_pb2, config_pb2_grpc
from sie_common.cluster.etcd import Etcd
from local_cluster import wait_for_leader
from test_config_service import MODEL, error_reason, model_config

WRITES_PER_WRITER = 8


class Writer:
    """A client that adds profiles one by one, following NOT_LEADER answers to the leader."""

    def __init__(self, name: str, first_address: str) -> None:
        self.name = name
        self.address = first_address
        self.epochs: list[int] = []
        self.redirects: list[tuple[str, str]] = []  # (refusing replica, leader it named)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for index in range(WRITES_PER_WRITER):
                profile = f"{self.name}-{index}"
                request = config_pb2.AddModelRequest(config=model_config(
                    default={"adapter": "sentence_transformer"}, **{profile: {"extends": "default"}},
                ))
                self.epochs.append(self._send(request, profile))
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error

    def _send(self, request: config_pb2.AddModelRequest, profile: str) -> int:
        for _ in range(20):
            with grpc.insecure_channel(self.address) as channel:
                try:
                    reply = config_pb2_grpc.ConfigServiceStub(channel).AddModel(request, timeout=30)
                except grpc.RpcError as error:
                    if error.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    reason, metadata = error_reason(error)
                    assert reason in ("NOT_LEADER", "WRITE_CONFLICT"), reason
                    if reason == "NOT_LEADER":
                        self.redirects.append((self.address, metadata["leader"]))
                        self.address = metadata["leader"]
                    continue
            assert profile in reply.added_profiles
            return reply.epoch
        raise AssertionError(f"{profile} was never written")


async def test_one_leader_writes_and_a_killed_leader_is_replaced(start_config, etcd: Etcd) -> None:
    first, second = start_config(), start_config()
    with grpc.insecure_channel(first.address) as channel:
        wait_for_leader(config_pb2_grpc.ConfigServiceStub(channel))
    leader_entry = await etcd.get("config/leader")
    assert leader_entry is not None
    leader, follower = (first, second) if first.address.encode() in leader_entry.value else (second, first)
    assert leader.address.encode() in leader_entry.value

    # Two writers start at different replicas and add profiles to one model at the same time.
    writers = [Writer("a", first.address), Writer("b", second.address)]
    threads = [threading.Thread(target=writer.run) for writer in writers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for writer in writers:
        assert writer.error is None, repr(writer.error)

    # The follower refused and named the leader; only the leader wrote.
    redirects = {redirect for writer in writers for redirect in writer.redirects}
    assert redirects == {(follower.address, leader.address)}
    assert "added profiles" in leader.log() and "added profiles" not in follower.log()
    # No write was lost: every profile is there, each write had its own revision.
    with grpc.insecure_channel(follower.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        stored = stub.GetModelConfig(config_pb2.GetModelConfigRequest(model=MODEL)).config
        expected = {"default"} | {f"{w.name}-{i}" for w in writers for i in range(WRITES_PER_WRITER)}
        assert set(stored.profiles) == expected
        epochs = [epoch for writer in writers for epoch in writer.epochs]
        assert len(set(epochs)) == len(epochs) == 2 * WRITES_PER_WRITER
        assert stub.GetEpoch(config_pb2.GetEpochRequest()).epoch == max(epochs)

        # kill -9: no resignation; the follower takes over once the leader's lease (3 s) runs out.
        leader.kill()
        killed_at = time.monotonic()
        request = config_pb2.AddModelRequest(config=model_config(default={"adapter": "sentence_transformer"}, after={"extends": "default"}))
        while True:
            try:
                reply = stub.AddModel(request, timeout=10)
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error
                assert error_reason(error)[0] in ("NOT_LEADER", "NO_LEADER")
                assert time.monotonic() - killed_at < 60, "the follower never took over"
                time.sleep(0.2)
        assert list(reply.added_profiles) == ["after"] and reply.epoch > max(epochs)
    new_leader = await etcd.get("config/leader")
    assert new_leader is not None and follower.address.encode() in new_leader.value


async def test_a_stopped_leader_resigns_at_once(start_config, etcd: Etcd) -> None:
    first = start_config(SIE_CONFIG_LEADER_TTL_S="60")
    with grpc.insecure_channel(first.address) as channel:
        wait_for_leader(config_pb2_grpc.ConfigServiceStub(channel))
    second = start_config(SIE_CONFIG_LEADER_TTL_S="60")
    first.stop()  # SIGTERM revokes the lease; no 60 s wait
    with grpc.insecure_channel(second.address) as channel:
        stub = config_pb2_grpc.ConfigServiceStub(channel)
        deadline = time.monotonic() + 20
        while True:
            try:
                assert stub.AddModel(config_pb2.AddModelRequest(config=model_config()), timeout=10).created
                break
            except grpc.RpcError as error:
                if time.monotonic() > deadline:
                    pytest.fail(f"the second replica did not take over after the leader resigned: {error}")
                time.sleep(0.2)
