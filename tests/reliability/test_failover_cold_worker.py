"""Failover past a cold worker (issue 32, defect 6): no caller sees MODEL_LOADING while a warm worker can serve.

A worker killed with kill -9 and started again at once (as `sie up`'s
supervisor does, from a process that has done its imports) listens while its
preloads run, and its old etcd record still says the model is loaded until
that record's lease ends. The gateway takes a worker whose stream broke out of
routing at once and brings it back when its health check says SERVING; and a
request a worker refuses with MODEL_LOADING goes to a worker that has the
model loaded.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import grpc
import numpy as np

from local_cluster import gateway_model, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import from_tensor
from sie_stack.processes import Standby

from reliability.steady_load import SteadyLoad, reference_vectors

MODEL = "test/tiny-mean"
TEXTS = [f"cold worker failover sentence {n}" for n in range(16)]
ANSWERS = 20
# Longer than a restart takes: the killed worker's record still says MODEL is loaded when its successor listens.
LEASE_TTL_S = "30"


def loaded_on(address: str, workers: tuple[str, ...]) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: tuple(gateway_model(stub, MODEL).loaded_on) == workers, timeout_s=60, what=f"{workers} warm")


def refused_while_loading(metrics_url: str) -> float:
    """How many encode requests of MODEL the worker answered UNAVAILABLE (its MODEL_LOADING refusals)."""
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    pattern = rf'sie_worker_requests_total\{{model="{re.escape(MODEL)}",operation="encode",status="UNAVAILABLE"\}} (\S+)'
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def test_kill_9_and_an_at_once_restart_of_one_of_two_warm_workers(cluster, tmp_path: Path, reliability_report) -> None:
    warm = {"SIE_PRELOAD_MODELS": MODEL, "SIE_WORKER_LEASE_TTL_S": LEASE_TTL_S}
    cluster.start_worker("w1", **warm)
    victim = cluster.start_worker("w2", **warm)
    standby = Standby("sie_worker", victim.env, tmp_path / "standby.ready")
    victim.standby = standby
    try:
        wait_until(standby.ready_path.exists, timeout_s=120, what="the standby worker's imports")
        gateway = cluster.start_gateway()
        loaded_on(gateway.address, ("w1", "w2"))
        references = reference_vectors(gateway.address, MODEL, TEXTS)
        with SteadyLoad(gateway.address, MODEL, references) as load:
            load.wait_for_answers(ANSWERS)
            load.mark_fault()
            victim.kill()
            victim.respawn()  # the standby takes its place: same id, port, environment and metrics port
            victim.wait_serving()
            served = load.figures.served_by["w2"]
            wait_until(lambda: load.figures.served_by["w2"] > served, what="the restarted worker back in routing")
            load.wait_for_answers(ANSWERS)
            figures = load.stop()
        refusals = refused_while_loading(victim.metrics_url)
    finally:
        standby.stop()
    assert figures.lost == 0 and figures.duplicated == 0 and figures.wrong == 0, figures
    # No caller saw an error, not even one its client retried: the gateway routed around the restarting worker.
    assert not figures.failed and not figures.retried, figures
    assert figures.ok == figures.sent, figures
    # The restarted process never got a request before its preload was done.
    assert refusals == 0
    reliability_report.add("faults", "kill -9 of a warm worker, restarted at once (sie up)", **figures.row())


def test_a_cold_worker_answering_model_loading_sends_the_request_to_a_warm_one(cluster) -> None:
    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MODEL)
    # It evicts MODEL after a second idle and does not publish that for 10 minutes: its record says MODEL is
    # loaded while it is not. Its id sorts first, so of two idle warm workers the gateway picks it.
    cold = cluster.start_worker(
        "w0",
        SIE_PRELOAD_MODELS=MODEL,
        SIE_IDLE_EVICT_S="1",
        SIE_MEMORY_CHECK_INTERVAL_S="0.5",
        SIE_HEALTH_PUBLISH_INTERVAL_MS="600000",
    )
    gateway = cluster.start_gateway()
    loaded_on(gateway.address, ("w0", "w1"))
    wait_until(lambda: f"evicting {MODEL}" in cold.log(), what="the idle model evicted")
    request = inference_pb2.EncodeRequest(model=MODEL, request_id="r1", items=[types_pb2.Item(text=TEXTS[0])])
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        response, call = stub.Encode.with_call(request, timeout=30)
        assert dict(call.trailing_metadata())["x-sie-worker"] == "w1"
        assert response.request_id == "r1" and len(response.results) == 1
        with grpc.insecure_channel(cluster.processes[0].address) as direct:
            expected = inference_pb2_grpc.InferenceStub(direct).Encode(request, timeout=30)
    np.testing.assert_allclose(from_tensor(response.results[0].dense), from_tensor(expected.results[0].dense), atol=1e-5)
    # The cold worker did refuse it (the case this test is about), once; the caller got one answer, from w1.
    assert refused_while_loading(cold.metrics_url) == 1
