"""Adversarial use of the client's surface (issue 22) against real processes on loopback: pools with a bundle,
routing headers and names long enough that an error echoing them would not fit in its trailers.

Each case asserts the exact status and reason, and that the stack still answers a known request after it.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from grpc_helpers import error_info, error_reason
from local_cluster import gateway_model, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import PoolError, ProvisioningTimeoutError, ServerError, SIEClient

MEAN = "test/tiny-mean"
# Longer than the 16 KiB of trailers a grpc client takes: an error that echoed it would reach the caller as
# RESOURCE_EXHAUSTED "Stream removed", its status and reason lost.
LONG = 20_000


def encode_request(text: str) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text=text)])


def refusal(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def test_pool_names_bundles_profiles_and_routing_headers_are_bounded_before_they_are_echoed(cluster, reliability_report) -> None:
    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(SIE_POOLS_ENABLED="true", SIE_POOL_MAX_WORKERS="3", SIE_POOL_QUOTA_WORKERS="3")
    long = "b" * LONG
    cases = {
        "CreatePool, a long bundle": lambda stub: stub.CreatePool(
            inference_pb2.CreatePoolRequest(name="p", gpus={"default": 1}, bundle=long), timeout=30
        ),
        "CreatePool, a long name": lambda stub: stub.CreatePool(inference_pb2.CreatePoolRequest(name=long, gpus={"default": 1}), timeout=30),
        # 2 MB: more than etcd takes in one request (it was written there, and failed as UNKNOWN).
        "CreatePool, a 2 MB machine profile": lambda stub: stub.CreatePool(
            inference_pb2.CreatePoolRequest(name="p", gpus={"g" * 2_000_000: 1}), timeout=30
        ),
        "CreatePool, a 1 KB machine profile": lambda stub: stub.CreatePool(
            inference_pb2.CreatePoolRequest(name="p", gpus={"g" * 1000: 1}), timeout=30
        ),
        "GetPool, a long name": lambda stub: stub.GetPool(inference_pb2.GetPoolRequest(name=long), timeout=30),
        "RenewPool, a long name": lambda stub: stub.RenewPool(inference_pb2.RenewPoolRequest(name=long), timeout=30),
        "DeletePool, a long name": lambda stub: stub.DeletePool(inference_pb2.DeletePoolRequest(name=long), timeout=30),
        "Encode, a long x-sie-pool": lambda stub: stub.Encode(encode_request("x"), metadata=(("x-sie-pool", "p" * 7000),), timeout=30),
        "Encode, a long x-sie-machine-profile": lambda stub: stub.Encode(
            encode_request("x"), metadata=(("x-sie-machine-profile", "p" * 7000),), timeout=30
        ),
    }
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: gateway_model(stub, MEAN).loaded_on == ["w1"], what="worker registered")
        for name, call in cases.items():
            refused = refusal(lambda call=call: call(stub))
            reliability_report.add("adversarial client", name, status=refused.code().name, reason=error_reason(refused))
            assert (refused.code(), error_reason(refused)) == (grpc.StatusCode.INVALID_ARGUMENT, "NAME_TOO_LONG"), name
            assert error_info(refused).metadata["setting"] == "SIE_MAX_NAME_BYTES"
        # Nothing was reserved on the way, and the stack still serves.
        assert not stub.ListPools(inference_pb2.ListPoolsRequest(), timeout=30).pools
        assert list(stub.Encode(encode_request("a known request"), timeout=60).results[0].dense.shape) == [32]


def test_a_pool_whose_min_workers_never_come_is_deleted_when_create_pool_gives_up(cluster, reliability_report) -> None:
    """A bundle that exists, with no worker of the profile asked for: the wait times out, and the pool it created
    is not left renewing in the background, holding the caller's quota until the client closes."""
    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(SIE_POOLS_ENABLED="true", SIE_POOL_QUOTA_WORKERS="1", SIE_GATEWAY_CONFIGURED_GPUS="l4")
    with SIEClient(gateway.address, timeout_s=30) as client:
        with pytest.raises(ProvisioningTimeoutError):
            client.create_pool("lonely", {"l4": 1}, bundle="default", min_workers=1, timeout_s=0.5, poll_s=0.1)
        reliability_report.add("adversarial client", "create_pool whose min_workers never come", pools_left=len(client.get_capacity()["pools"]))
        assert client.get_capacity()["pools"] == []
        # The quota of one worker is free again: the same pool can be created (and is, without waiting).
        pool = client.create_pool("lonely", {"l4": 1}, bundle="default")
        assert (pool["name"], pool.get("workers", []), pool["bundle"]) == ("lonely", [], "default")
        client.delete_pool("lonely")


def test_a_long_list_sent_to_a_worker_that_stops_answering_ends_with_deadline_exceeded(start_worker, reliability_report) -> None:
    """A list longer than stream_batch_size goes over EncodeStream, which has no deadline of its own. A worker that
    stops answering (SIGSTOP: its connection stays open) must not hold the caller for ever: each answer is due within
    timeout_s. The guard below only keeps a regression from hanging the suite."""
    worker = start_worker(SIE_PRELOAD_MODELS=MEAN)
    with SIEClient(worker.address, timeout_s=2, stream_batch_size=4) as client, ThreadPoolExecutor(1) as pool:
        assert len(client.encode(MEAN, [f"warm {n}" for n in range(8)])) == 8
        os.kill(worker.process.pid, signal.SIGSTOP)
        try:
            outcome = pool.submit(client.encode, MEAN, [f"stalled {n}" for n in range(8)])
            with pytest.raises(ServerError) as stalled:
                outcome.result(timeout=120)
        finally:
            os.kill(worker.process.pid, signal.SIGCONT)
        reliability_report.add("adversarial client", "EncodeStream to a stopped worker", status=stalled.value.grpc_code.name)
        assert stalled.value.grpc_code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert len(client.encode(MEAN, [f"after {n}" for n in range(8)])) == 8


def test_requests_may_name_only_a_pool_their_token_created(cluster, reliability_report) -> None:
    """A pool isolates its creator's capacity: on main any token could send requests to another's pool (x-sie-pool)
    and take the workers it reserved, though only the creator may renew or delete it."""
    tokens = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": "alice-token,mallory-token", "SIE_WORKER_TOKEN": "work"}
    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MEAN, **tokens)
    # One worker: the pool may take it (by default one worker of each bundle stays shared).
    gateway = cluster.start_gateway(
        SIE_POOLS_ENABLED="true", SIE_ALLOW_UNAUTHENTICATED_WORKERS="true", SIE_POOL_SHARED_WORKERS="0", SIE_POOL_MAX_SHARE="1", **tokens
    )
    alice, mallory = (("authorization", "Bearer alice-token"),), (("authorization", "Bearer mallory-token"),)
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: gateway_model(stub, MEAN, alice).loaded_on == ["w1"], what="worker registered")
        pool = stub.CreatePool(
            inference_pb2.CreatePoolRequest(name="alices", gpus={"default": 1}, ttl_s=60, bundle="default"), metadata=alice, timeout=30
        )
        assert list(pool.pool.workers) == ["w1"]
        wait_until(
            lambda: [p.name for p in stub.ListPools(inference_pb2.ListPoolsRequest(), metadata=alice, timeout=30).pools] == ["alices"],
            what="pool in mirror",
        )
        in_pool = (("x-sie-pool", "alices"),)
        refused = refusal(lambda: stub.Encode(encode_request("mallory's"), metadata=mallory + in_pool, timeout=30))
        reliability_report.add("adversarial client", "Encode into another token's pool", status=refused.code().name, reason=error_reason(refused))
        assert (refused.code(), error_reason(refused)) == (grpc.StatusCode.PERMISSION_DENIED, "POOL_NOT_OWNED")
        with SIEClient(gateway.address, api_key="mallory-token", timeout_s=30) as client, pytest.raises(PoolError) as denied:
            client.encode(MEAN, "mallory's", pool="alices")
        assert denied.value.reason == "POOL_NOT_OWNED"
        assert list(stub.Encode(encode_request("alice's"), metadata=alice + in_pool, timeout=60).results[0].dense.shape) == [32]
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="alices"), metadata=alice, timeout=30)


def test_a_pool_deleted_behind_the_clients_back_is_no_longer_renewed(cluster, reliability_report) -> None:
    """The client renews its pools in the background. Once a pool is gone (deleted elsewhere, or expired) the
    renewer stops: on main it went on, so a pool created later under the same name never expired."""
    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(SIE_POOLS_ENABLED="true")
    with SIEClient(gateway.address, timeout_s=30) as client, gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        client.create_pool("reused", {"default": 1}, ttl_s=3)  # renewed every second
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="reused"), timeout=30)
        time.sleep(3)  # a few renewal periods: the renewer meets POOL_NOT_FOUND
        stub.CreatePool(inference_pb2.CreatePoolRequest(name="reused", gpus={"default": 1}, ttl_s=2), timeout=30)

        def expired() -> bool:
            return "reused" not in [pool.name for pool in stub.ListPools(inference_pb2.ListPoolsRequest(), timeout=30).pools]

        wait_until(expired, what="the new pool's lease to expire", timeout_s=30)
        reliability_report.add("adversarial client", "pool re-created after the client's was deleted", expired=True)
