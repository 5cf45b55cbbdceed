"""Faults and load on a real cluster on loopback (etcd, two config replicas, two workers, a gateway).

Each fault runs under a steady load whose every answer is checked against a
reference (steady_load.py says what is counted); each adds its figures to the
"faults" section of the reliability summary, and the 64-client load test to
"load". The tests share one cluster; each starts by bringing back what an
earlier fault left dead, so each can also run alone.
"""

from __future__ import annotations

import signal
import threading
import time

import grpc
import numpy as np
import pytest

from reliability.fault_stack import MODEL, WORKERS, FaultStack
from grpc_helpers import call_until_loaded
from local_cluster import gateway_model, model_config, wait_until
from worker_process import Services
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_client.retry import RetryPolicy
from sie_client.status import call_status
from sie_contract.tensors import from_tensor
from reliability.steady_load import LoadFigures, SteadyLoad, reference_vectors, rss_mb

TEXTS = [f"reliability check sentence number {n}" for n in range(24)]
# Answers before and after each fault, so the load surely spans it.
ANSWERS = 20
# Per-attempt deadline while a worker is stalled: shorter than its lease (3 s), so some callers see it expire.
STALL_DEADLINE_S = 2.0
ETCD_OUTAGE_S = 10.0
LOAD_CLIENTS = 64
# The load test's answers: the first WARM_UP_ANSWERS before memory is read, then LOAD_ANSWERS more (counted, not
# timed: a busy machine takes longer over the same work instead of doing less of it).
WARM_UP_ANSWERS = 2000
LOAD_ANSWERS = 8000
LOAD_TIMEOUT_S = 600
# RSS may grow by this much between the end of the warm-up and the end of the load.
RSS_TOLERANCE = 0.10
RSS_SLACK_MB = 24.0


@pytest.fixture(scope="module")
def fault_stack(services: Services, tmp_path_factory: pytest.TempPathFactory, tiny_models) -> FaultStack:
    return services.keep(FaultStack(tmp_path_factory.mktemp("faults"), tiny_models[MODEL]))


@pytest.fixture(scope="module")
def references(fault_stack: FaultStack) -> dict[str, np.ndarray]:
    fault_stack.ready()
    return reference_vectors(fault_stack.gateway.address, MODEL, TEXTS)


@pytest.fixture
def ready(fault_stack: FaultStack, references: dict[str, np.ndarray]) -> FaultStack:
    fault_stack.ready()
    return fault_stack


def steady_load(stack: FaultStack, references: dict[str, np.ndarray], **options: object) -> SteadyLoad:
    return SteadyLoad(stack.gateway.address, MODEL, references, **options)


def routed_to(stack: FaultStack, workers: tuple[str, ...], timeout_s: float = 60) -> None:
    """Wait until the gateway routes `MODEL` to exactly `workers`."""
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == workers, timeout_s=timeout_s, what=f"routing to {workers}")


def assert_nothing_lost(figures: LoadFigures, allowed_failures: frozenset[str] = frozenset()) -> None:
    assert figures.lost == 0 and figures.duplicated == 0 and figures.wrong == 0, figures
    assert set(figures.failed) <= allowed_failures, figures
    assert figures.ok + sum(figures.failed.values()) == figures.sent, figures


def test_kill_9_of_a_worker(ready: FaultStack, references, reliability_report) -> None:
    with steady_load(ready, references) as load:
        load.wait_for_answers(ANSWERS)
        load.mark_fault()
        ready.workers["w2"].kill()
        routed_to(ready, ("w1",))  # its lease ran out
        load.wait_for_answers(ANSWERS)
        figures = load.stop()
    assert_nothing_lost(figures)  # in flight on w2: sent again to w1 by the gateway
    assert figures.served_by["w1"] >= ANSWERS
    reliability_report.add("faults", "kill -9 of a worker", **figures.row())


def test_a_stalled_worker(ready: FaultStack, references, reliability_report) -> None:
    stalled = ready.workers["w2"]
    with steady_load(ready, references, attempt_timeout_s=STALL_DEADLINE_S) as load:
        load.wait_for_answers(ANSWERS)
        load.mark_fault()
        stalled.process.send_signal(signal.SIGSTOP)
        try:
            routed_to(ready, ("w1",))  # its lease ran out: the gateway routes around it
            load.wait_for_answers(ANSWERS)
        finally:
            stalled.process.send_signal(signal.SIGCONT)
        routed_to(ready, WORKERS)  # it registers again and serves again
        served = load.figures.served_by["w2"]
        wait_until(lambda: load.figures.served_by["w2"] > served, what="the resumed worker serves again")
        figures = load.stop()
    # Calls in flight on the stalled worker end at their deadline, none hangs.
    assert_nothing_lost(figures, allowed_failures=frozenset({"DEADLINE_EXCEEDED/DEADLINE_EXCEEDED", "DEADLINE_EXCEEDED"}))
    assert load.longest_attempt_s < STALL_DEADLINE_S + 5
    reliability_report.add("faults", "a stalled worker (SIGSTOP, SIGCONT)", **figures.row(), deadline_s=STALL_DEADLINE_S)


def test_sigterm_on_a_worker(ready: FaultStack, references, reliability_report) -> None:
    leaving = ready.workers["w1"]
    with steady_load(ready, references) as load:
        load.wait_for_answers(ANSWERS)
        load.mark_fault()
        leaving.process.send_signal(signal.SIGTERM)
        exit_code = leaving.process.wait(timeout=60)
        registered = ready.etcd_call(lambda etcd: etcd.read_prefix("workers/"))[0]
        load.wait_for_answers(ANSWERS)
        figures = load.stop()
    assert exit_code == 0 and "drained: no requests in flight" in leaving.log()
    assert [entry.name for entry in registered] == ["workers/w2"]  # deregistered on the way out
    assert_nothing_lost(figures)
    assert not figures.failed and not figures.retried  # a refusal while draining goes to the other worker inside the gateway
    reliability_report.add("faults", "SIGTERM on a worker", **figures.row())


def test_gateway_restart(ready: FaultStack, references, reliability_report) -> None:
    with steady_load(ready, references) as load:
        load.wait_for_answers(ANSWERS)
        load.mark_fault()
        ready.gateway.kill()
        ready.restart_gateway()  # on the same port; serving once it has read etcd
        load.wait_for_answers(ANSWERS)
        figures = load.stop()
    assert_nothing_lost(figures)  # calls cut by the kill were retried (UNAVAILABLE) and answered
    routed_to(ready, WORKERS)
    reliability_report.add("faults", "gateway restarted (kill -9, started again)", **figures.row())


def test_compaction_while_the_gateway_is_cut_off(ready: FaultStack, references, reliability_report) -> None:
    added = "test/added-while-cut-off"
    leaving = ready.workers["w2"]
    with steady_load(ready, references) as load:
        load.wait_for_answers(ANSWERS)
        load.mark_fault()
        ready.etcd_link.cut()  # the gateway's watches break; it routes from what it has
        ready.add_model(added)
        leaving.stop()  # deregisters; the gateway does not see it and fails its requests over
        load.wait_for_answers(ANSWERS)
        compacted_at = ready.etcd_call(lambda etcd: etcd.put("faults/marker", b"compacted here"))
        ready.etcd_call(lambda etcd: etcd.compact(compacted_at))
        restored_at = time.monotonic()
        ready.etcd_link.restore()
        with grpc.insecure_channel(ready.gateway.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)

            def caught_up() -> bool:
                models = {model.id for model in stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10).models}
                return added in models and list(gateway_model(stub, MODEL).loaded_on) == ["w1"]

            wait_until(caught_up, timeout_s=60, what="the gateway re-read etcd after the compaction")
        caught_up_s = round(time.monotonic() - restored_at, 2)
        load.wait_for_answers(ANSWERS)
        figures = load.stop()
    assert_nothing_lost(figures)
    assert not figures.retried  # the departed worker's refusals and closed port were failed over inside the gateway
    assert "reading everything again" in ready.gateway.log()  # the watch could not resume: a full read
    reliability_report.add("faults", "compaction while the gateway is cut off from etcd", **figures.row(), caught_up_s=caught_up_s)


def test_etcd_stopped_for_10_s(ready: FaultStack, references, reliability_report) -> None:
    after = "test/added-after-etcd-outage"
    leader, _ = ready.leader_and_follower()
    with grpc.insecure_channel(leader.address) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        before = {config.id for config in admin.ListModelConfigs(config_pb2.ListModelConfigsRequest(), timeout=10).configs}
        with steady_load(ready, references) as load:
            load.wait_for_answers(ANSWERS)
            # History compacted just before, as etcd's auto-compaction does: every watch must resume or re-read.
            compacted_at = ready.etcd_call(lambda etcd: etcd.put("faults/marker", b"before the outage"))
            ready.etcd_call(lambda etcd: etcd.compact(compacted_at))
            load.mark_fault()
            stopped_at = time.monotonic()
            ready.etcd.stop()
            with pytest.raises(grpc.RpcError) as refused:
                ready.add_model("test/added-during-etcd-outage", leader.address, timeout_s=30)
            status = call_status(refused.value)
            load.wait_for_answers(ANSWERS)  # inference goes on from the mirrors
            time.sleep(max(0.0, ETCD_OUTAGE_S - (time.monotonic() - stopped_at)))  # the outage itself
            ready.etcd.start()
            back_at = time.monotonic()
            write_recovery_s = round(config_write_succeeds(ready, after) - back_at, 2)
            served_at = served_through_gateway(ready, after, references)
            routed_to(ready, WORKERS)
            load.wait_for_answers(ANSWERS)
            figures = load.stop()
        after_ids = {config.id for config in admin.ListModelConfigs(config_pb2.ListModelConfigsRequest(), timeout=10).configs}
    assert status.code == grpc.StatusCode.UNAVAILABLE and status.reason in ("ETCD_UNAVAILABLE", "NO_LEADER"), status
    assert after_ids == before | {after}  # nothing written before the outage was lost
    assert_nothing_lost(figures)
    assert not figures.retried  # the workers reconnected within their lease: the gateway never lost them
    reliability_report.add(
        "faults",
        "etcd stopped for 10 s",
        **{**figures.row(), "recovery_s": round(served_at - back_at, 2)},
        outage_s=round(back_at - stopped_at, 1),
        config_write_during_outage=f"{status.code.name}/{status.reason}",
        write_recovery_s=write_recovery_s,
    )


def config_write_succeeds(stack: FaultStack, model_id: str, timeout_s: float = 60) -> float:
    """Add `model_id` through any config replica, retrying UNAVAILABLE; when it was acknowledged."""
    deadline = time.monotonic() + timeout_s
    while True:
        for replica in stack.configs:
            try:
                stack.add_model(model_id, replica.address)
                return time.monotonic()
            except grpc.RpcError as error:
                status = call_status(error)
                if status.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                # A replica never sends writers to itself (it did, following its own pre-outage key).
                assert status.metadata.get("leader") != replica.address, status
        time.sleep(0.2)


def served_through_gateway(stack: FaultStack, model_id: str, references: dict[str, np.ndarray]) -> float:
    """Encode through the gateway with a model added after the fault (same weights as MODEL); when it answered."""
    text = TEXTS[0]
    request = inference_pb2.EncodeRequest(model=model_id, items=[types_pb2.Item(text=text)])
    with grpc.insecure_channel(stack.gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        def every_worker_has_it() -> bool:
            try:
                rollouts = gateway_model(stub, model_id).rollouts
            except grpc.RpcError:  # NOT_FOUND until the gateway's watch delivers the config
                return False
            return [list(rollout.current_workers) for rollout in rollouts] == [list(WORKERS)]

        wait_until(every_worker_has_it, timeout_s=60, what=f"{model_id} at the gateway and on every worker")
        response, _ = call_until_loaded(lambda: stub.Encode(request, timeout=30))
    np.testing.assert_allclose(from_tensor(response.results[0].dense), references[text], atol=1e-4)
    return time.monotonic()


class ConfigWriter:
    """Adds profiles p0, p1, ... to one model one at a time, following the leader; each until acknowledged."""

    def __init__(self, stack: FaultStack, model_id: str) -> None:
        self._stack = stack
        self._model_id = model_id
        self._addresses = [replica.address for replica in stack.configs]
        self._address = self._addresses[0]
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.acknowledged: list[tuple[str, float, str]] = []  # (profile, when, replica address)
        self.sent = 0
        self.retried = 0
        self.failed: list[str] = []

    def __enter__(self) -> ConfigWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=90)

    def wait_for_acks(self, count: int, timeout_s: float = 60) -> None:
        target = len(self.acknowledged) + count
        wait_until(lambda: len(self.acknowledged) >= target, timeout_s=timeout_s, what=f"{count} acknowledged config writes")

    @property
    def lost(self) -> int:
        return 0 if not self._thread.is_alive() else 1

    def _run(self) -> None:
        number = 0
        while not self._stopping.is_set():
            profile = f"p{number}"
            number += 1
            self.sent += 1
            if self._write(profile):
                self.acknowledged.append((profile, time.monotonic(), self._address))

    def _write(self, profile: str, timeout_s: float = 60) -> bool:
        config = model_config(self._model_id, self._stack.weights, profiles={
            "default": {"adapter": "sentence_transformer"}, profile: {"extends": "default"},
        })
        request = config_pb2.AddModelRequest(config=config)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with grpc.insecure_channel(self._address) as channel:
                try:
                    reply = config_pb2_grpc.ConfigServiceStub(channel).AddModel(request, timeout=10)
                except grpc.RpcError as error:
                    status = call_status(error)
                    if status.code != grpc.StatusCode.UNAVAILABLE:
                        self.failed.append(f"{status.code.name}/{status.reason}")
                        return False
                    self.retried += 1
                    if status.reason == "NOT_LEADER":
                        self._address = status.metadata["leader"]
                    elif not status.reason:  # the replica is gone: try another
                        self._address = self._addresses[(self._addresses.index(self._address) + 1) % len(self._addresses)]
                    time.sleep(0.1)
                    continue
            # A retry of a write that committed before its answer was lost finds the profile there: skipped.
            return profile in reply.added_profiles or profile in reply.skipped_profiles
        self.failed.append("gave up")
        return False


def test_config_leader_killed(ready: FaultStack, references, reliability_report) -> None:
    model_id = "test/written-across-a-leader-kill"
    leader, follower = ready.leader_and_follower()
    with steady_load(ready, references) as load, ConfigWriter(ready, model_id) as writer:
        writer.wait_for_acks(5)
        load.mark_fault()
        killed_at = time.monotonic()
        leader.kill()
        wait_until(lambda: any(address == follower.address for _, _, address in writer.acknowledged), what="a write acknowledged by the follower")
        writer.wait_for_acks(5)
        writer.stop()
        figures = load.stop()
    takeover_s = round(next(when for _, when, address in writer.acknowledged if address == follower.address) - killed_at, 2)
    assert ready.leader_and_follower()[0] is follower
    with grpc.insecure_channel(follower.address) as channel:
        stored = config_pb2_grpc.ConfigServiceStub(channel).GetModelConfig(config_pb2.GetModelConfigRequest(model=model_id), timeout=10).config
    acknowledged = {profile for profile, _, _ in writer.acknowledged}
    assert acknowledged <= set(stored.profiles)  # no acknowledged write was lost
    assert writer.failed == [] and writer.lost == 0
    assert_nothing_lost(figures)
    reliability_report.add(
        "faults",
        "config leader killed (two replicas)",
        sent=writer.sent,
        ok=len(acknowledged),
        failed=len(writer.failed),
        lost=writer.lost,
        duplicated=0,
        recovery_s=takeover_s,
        retried=writer.retried,
        inference_sent=figures.sent,
        inference_failed=sum(figures.failed.values()),
    )


def test_64_clients_for_10000_answers(ready: FaultStack, references, reliability_report) -> None:
    processes = {
        "gateway": ready.gateway, **ready.workers, "config": ready.configs[0], "etcd": ready.etcd,
    }
    pids = {name: process.process.pid for name, process in processes.items()}
    with steady_load(ready, references, clients=LOAD_CLIENTS, pause_s=0, attempt_timeout_s=30, policy=RetryPolicy()) as load:
        started = time.monotonic()
        load.wait_for_answers(WARM_UP_ANSWERS, timeout_s=LOAD_TIMEOUT_S, what="warm-up")
        rss_start = {name: rss_mb(pid) for name, pid in pids.items()}
        load.wait_for_answers(LOAD_ANSWERS, timeout_s=LOAD_TIMEOUT_S, what="load")
        rss_end = {name: rss_mb(pid) for name, pid in pids.items()}
        figures = load.stop()
        seconds = round(time.monotonic() - started, 1)
    errors = sum(figures.failed.values()) + sum(figures.retried.values()) + figures.wrong + figures.lost + figures.duplicated
    reliability_report.add(
        "load", f"{LOAD_CLIENTS} clients through the gateway to two workers",
        clients=LOAD_CLIENTS, seconds=seconds, requests=figures.sent, errors=errors,
        served_by=",".join(f"{worker}:{n}" for worker, n in sorted(figures.served_by.items())),
    )
    for name in pids:
        reliability_report.add("load", f"rss {name}", rss_start_mb=round(rss_start[name], 1), rss_end_mb=round(rss_end[name], 1))
    assert errors == 0, figures
    assert figures.ok == figures.sent
    grown = {name: (rss_start[name], rss_end[name]) for name in pids if rss_end[name] > rss_start[name] * (1 + RSS_TOLERANCE) + RSS_SLACK_MB}
    assert not grown, f"memory grew past {RSS_TOLERANCE:.0%} + {RSS_SLACK_MB} MiB after the warm-up: {grown}"
