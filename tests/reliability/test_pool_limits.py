"""Operator limits on resource pools (issue 32, defect 7), on a real stack with pools on and two tenants.

One tenant's pool may not take every shared worker: a pool holds at most
SIE_POOL_MAX_SHARE of each bundle's workers and SIE_POOL_SHARED_WORKERS of
them stay shared; a token holds at most SIE_POOL_QUOTA_POOLS pools; no renewal
carries a pool past SIE_POOL_MAX_LIFETIME_S; and a pool is seen only with its
creator's token.
"""

from __future__ import annotations

import time

import grpc
import pytest

from grpc_helpers import error_info, error_reason
from local_cluster import gateway_model, served_by, wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.runtime.settings import SettingsError
from sie_gateway.settings import GatewaySettings

MODEL = "test/tiny-mean"
TENANTS = {"a": "tenant-a-token", "b": "tenant-b-token"}
POOLS_ON = {"SIE_POOLS_ENABLED": "true", "SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": ",".join(TENANTS.values())}


def as_tenant(name: str, pool: str = "") -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {TENANTS[name]}"), *((("x-sie-pool", pool),) if pool else ()))


def encode(stub, text: str, metadata) -> tuple:
    request = inference_pb2.EncodeRequest(model=MODEL, request_id=text, items=[types_pb2.Item(text=text)])
    return stub.Encode.with_call(request, metadata=metadata, timeout=30)


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value


def test_a_pool_leaves_shared_workers_and_is_seen_only_by_its_owner(cluster) -> None:
    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MODEL)
    cluster.start_worker("w2", SIE_PRELOAD_MODELS=MODEL)
    gateways = [cluster.start_gateway(**POOLS_ON), cluster.start_gateway(**POOLS_ON)]
    channels = [grpc.insecure_channel(gateway.address) for gateway in gateways]
    try:
        first, second = (inference_pb2_grpc.InferenceStub(channel) for channel in channels)
        for stub in (first, second):
            wait_until(lambda stub=stub: list(gateway_model(stub, MODEL, as_tenant("a")).loaded_on) == ["w1", "w2"], what="both workers")

        # Asked for both workers of a 2-worker stack, the pool gets one (half of them, SIE_POOL_MAX_SHARE=0.5).
        pool = first.CreatePool(inference_pb2.CreatePoolRequest(name="pool-a", gpus={"default": 2}, ttl_s=30), metadata=as_tenant("a")).pool
        assert (list(pool.workers), pool.ready) == (["w1"], False)
        # Nor can another tenant's pool take the last shared one (SIE_POOL_SHARED_WORKERS=1).
        other = second.CreatePool(inference_pb2.CreatePoolRequest(name="pool-b", gpus={"default": 1}, ttl_s=30), metadata=as_tenant("b")).pool
        assert (list(other.workers), other.ready) == ([], False)
        renewed = first.RenewPool(inference_pb2.RenewPoolRequest(name="pool-a"), metadata=as_tenant("a")).pool
        assert list(renewed.workers) == ["w1"]
        for stub in (first, second):
            wait_until(lambda stub=stub: len(stub.ListPools(inference_pb2.ListPoolsRequest(), metadata=as_tenant("a")).pools) == 1, what="pools in the mirror")

        # Requests without a pool are served, on both gateways, by the worker left shared; the pool's by its own.
        for stub in (first, second):
            for tenant in TENANTS:
                assert {served_by(encode(stub, f"shared {tenant} {n}", as_tenant(tenant))) for n in range(4)} == {"w2"}
            assert {served_by(encode(stub, f"in pool {n}", as_tenant("a", "pool-a"))) for n in range(4)} == {"w1"}

        # Pools are visible to their owner only: GetPool of another's answers as RenewPool and DeletePool do.
        for stub in (first, second):
            denied = refused(lambda stub=stub: stub.GetPool(inference_pb2.GetPoolRequest(name="pool-a"), metadata=as_tenant("b")))
            assert (denied.code(), error_reason(denied)) == (grpc.StatusCode.PERMISSION_DENIED, "POOL_NOT_OWNED")
            for action in (
                lambda stub=stub: stub.RenewPool(inference_pb2.RenewPoolRequest(name="pool-a"), metadata=as_tenant("b")),
                lambda stub=stub: stub.DeletePool(inference_pb2.DeletePoolRequest(name="pool-a"), metadata=as_tenant("b")),
            ):
                error = refused(action)
                assert (error.code(), error_reason(error)) == (grpc.StatusCode.PERMISSION_DENIED, "POOL_NOT_OWNED")
            assert [p.name for p in stub.ListPools(inference_pb2.ListPoolsRequest(), metadata=as_tenant("a")).pools] == ["pool-a"]
            assert [p.name for p in stub.ListPools(inference_pb2.ListPoolsRequest(), metadata=as_tenant("b")).pools] == ["pool-b"]
            assert stub.GetPool(inference_pb2.GetPoolRequest(name="pool-a"), metadata=as_tenant("a")).pool.workers == ["w1"]

        # A token holds at most SIE_POOL_QUOTA_POOLS (2) pools at once.
        first.CreatePool(inference_pb2.CreatePoolRequest(name="pool-a2", gpus={"default": 1}, ttl_s=30), metadata=as_tenant("a"))
        third = refused(lambda: first.CreatePool(inference_pb2.CreatePoolRequest(name="pool-a3", gpus={"default": 1}, ttl_s=30), metadata=as_tenant("a")))
        assert (third.code(), error_reason(third)) == (grpc.StatusCode.RESOURCE_EXHAUSTED, "POOL_COUNT_EXCEEDED")
        assert dict(error_info(third).metadata) == {"limit": "2", "held": "2"}

        # Deleted, the pool's worker is shared again.
        first.DeletePool(inference_pb2.DeletePoolRequest(name="pool-a"), metadata=as_tenant("a"))
        wait_until(
            lambda: {served_by(encode(second, f"after {n}", as_tenant("b"))) for n in range(8)} == {"w1", "w2"},
            what="both workers shared again",
        )
    finally:
        for channel in channels:
            channel.close()


def test_no_renewal_carries_a_pool_past_its_maximum_lifetime(cluster) -> None:
    lifetime_s, ttl_s = 6, 2
    gateway = cluster.start_gateway(**POOLS_ON, SIE_POOL_MAX_LIFETIME_S=str(lifetime_s), SIE_POOL_MAX_TTL_S=str(ttl_s), SIE_POOL_DEFAULT_TTL_S=str(ttl_s))
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        created_at = time.time()
        stub.CreatePool(inference_pb2.CreatePoolRequest(name="short-lived", gpus={"default": 1}, ttl_s=ttl_s), metadata=as_tenant("a"))
        renewals = 0
        while True:
            try:
                pool = stub.RenewPool(inference_pb2.RenewPoolRequest(name="short-lived"), metadata=as_tenant("a"), timeout=10).pool
            except grpc.RpcError as error:
                refusal = error
                break
            renewals += 1
            assert pool.expires_at.seconds <= created_at + lifetime_s + 1
            assert time.time() - created_at < lifetime_s, "renewed past the lifetime"
            time.sleep(0.5)
        refused_at = time.time() - created_at
        assert (refusal.code(), error_reason(refusal)) == (grpc.StatusCode.FAILED_PRECONDITION, "POOL_LIFETIME_REACHED")
        assert error_info(refusal).metadata["limit"] == str(lifetime_s)
        assert renewals >= 2 and lifetime_s - ttl_s - 1 <= refused_at <= lifetime_s
        # It then runs out at its current expiry, within its lifetime (plus etcd's lease granularity).
        wait_until(
            lambda: not stub.ListPools(inference_pb2.ListPoolsRequest(), metadata=as_tenant("a")).pools,
            timeout_s=lifetime_s + 5,
            what="the pool's end",
        )
        assert time.time() - created_at <= lifetime_s + 2.5


@pytest.mark.parametrize(
    ("field", "value"),
    [("pool_max_share", 0.0), ("pool_max_share", 1.5), ("pool_shared_workers", -1), ("pool_quota_pools", 0), ("pool_max_lifetime_s", 60)],
)
def test_pool_limits_out_of_range_stop_the_gateway_at_start(field: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"SIE_{field.upper()}"):
        GatewaySettings(**{field: value})


# --- pools: another token's pool -------------------------------------------------------------------------------


def test_only_the_token_that_created_a_pool_may_renew_or_delete_it(cluster, reliability_report) -> None:
    """On main any caller could delete another token's pool (revoking its lease and its workers), or renew it
    forever past the owner's TTL, though the record names its owner."""

    cluster.start_worker("w1", SIE_PRELOAD_MODELS=MODEL, SIE_AUTH_MODE="static", SIE_AUTH_TOKENS="alice-token,mallory-token", SIE_WORKER_TOKEN="work")
    gateway = cluster.start_gateway(
        SIE_POOLS_ENABLED="true", SIE_AUTH_MODE="static", SIE_AUTH_TOKENS="alice-token,mallory-token", SIE_WORKER_TOKEN="work",
        SIE_ALLOW_UNAUTHENTICATED_WORKERS="true",  # the test's etcd has no authentication
    )
    alice, mallory = (("authorization", "Bearer alice-token"),), (("authorization", "Bearer mallory-token"),)
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: gateway_model(stub, MODEL, alice).loaded_on == ["w1"], what="worker registered")
        stub.CreatePool(inference_pb2.CreatePoolRequest(name="alices", gpus={"default": 1}, ttl_s=60), metadata=alice, timeout=30)
        for name, call in {
            "DeletePool": lambda: stub.DeletePool(inference_pb2.DeletePoolRequest(name="alices"), metadata=mallory, timeout=30),
            "RenewPool": lambda: stub.RenewPool(inference_pb2.RenewPoolRequest(name="alices"), metadata=mallory, timeout=30),
        }.items():
            with pytest.raises(grpc.RpcError) as raised:
                call()
            error = raised.value
            reliability_report.add("adversarial attack", f"{name} of another token's pool", expected="PERMISSION_DENIED POOL_NOT_OWNED", actual=f"{error.code().name} {error_reason(error)}")
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
            assert error_info(error).reason == "POOL_NOT_OWNED"
        assert stub.RenewPool(inference_pb2.RenewPoolRequest(name="alices"), metadata=alice, timeout=30).pool.name == "alices"
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="alices"), metadata=alice, timeout=30)
        answer = stub.Encode(inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text="still served")]), metadata=mallory, timeout=60)
        assert len(answer.results) == 1
