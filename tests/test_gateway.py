"""The gateway in front of real workers: affinity, failover, scale from zero, pools, limits, auth."""

from __future__ import annotations

import json
import threading
import time

import grpc
import numpy as np
import pytest

from local_cluster import gateway_model, served_by, wait_until
from grpc_helpers import call_until_loaded, error_reason
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import ProvisioningError, SIEClient
from sie_contract.tensors import from_tensor

MEAN = "test/tiny-mean"
CLS = "test/tiny-cls"
# Pools may take a bundle's last worker (by default one stays shared: tests/reliability/test_pool_limits.py).
POOLS_MAY_TAKE_EVERY_WORKER = {"SIE_POOL_SHARED_WORKERS": "0", "SIE_POOL_MAX_SHARE": "1"}


def request(model: str, text: str) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, request_id=text, items=[types_pb2.Item(text=text)])


def pool_in_mirror(stub, name: str) -> inference_pb2.Pool | None:
    """The pool as the gateway's mirror has it, or None while the mirror has not seen it yet (GetPool: NOT_FOUND)."""
    try:
        return stub.GetPool(inference_pb2.GetPoolRequest(name=name)).pool
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise


def workers_seen(stub, model: str, count: int, loaded_on: tuple[str, ...] = ()) -> None:
    def ready() -> bool:
        info = gateway_model(stub, model)
        members = {w for rollout in info.rollouts for w in [*rollout.current_workers, *rollout.lagging_workers]}
        return len(members) >= count and set(loaded_on) <= set(info.loaded_on)

    wait_until(ready, what=f"{count} workers for {model} (loaded on {loaded_on})")


def test_affinity_routes_to_the_warm_worker_and_a_cold_model_to_one_worker(cluster) -> None:
    """And EncodeStream and the errors through the gateway, on the same processes."""
    cluster.start_worker("warm", wait=False, SIE_PRELOAD_MODELS=MEAN)
    cluster.start_worker("cold", wait=False)
    gateway = cluster.start_gateway(wait=False)
    cluster.wait_serving()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        workers_seen(stub, MEAN, 2, loaded_on=("warm",))
        assert {served_by(stub.Encode.with_call(request(MEAN, f"a{n}"), timeout=30)) for n in range(10)} == {"warm"}
        # Loaded nowhere: every request goes to the same one worker, which loads it once.
        assert gateway_model(stub, CLS).loaded_on == []
        # The chosen worker answers UNAVAILABLE (MODEL_LOADING) while it loads; the client retries.
        chosen = {served_by(call_until_loaded(lambda n=n: stub.Encode.with_call(request(CLS, f"c{n}"), timeout=60))[0]) for n in range(6)}
        assert len(chosen) == 1
        wait_until(lambda: list(gateway_model(stub, CLS).loaded_on) == sorted(chosen), what="registration shows the load")
        rollout = gateway_model(stub, MEAN).rollouts[0]
        assert rollout.bundle == "default" and sorted(rollout.current_workers) == ["cold", "warm"]

        answers = list(stub.EncodeStream(iter([inference_pb2.EncodeStreamRequest(request=request(MEAN, f"s{n}")) for n in range(20)]), timeout=60))
        assert sorted(a.request_id for a in answers) == sorted(f"s{n}" for n in range(20))
        assert all(a.WhichOneof("outcome") == "response" for a in answers)
        with pytest.raises(grpc.RpcError) as missing:
            stub.Encode(request("no/such", "x"), timeout=10)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.RpcError) as bad:
            stub.Encode(inference_pb2.EncodeRequest(model=MEAN), timeout=10)  # the worker's own validation, passed through
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_reason(bad.value) == "NO_ITEMS"


def test_kill_9_of_a_worker_under_load_loses_no_request(cluster, stub) -> None:
    for name in ("w1", "w2", "w3"):
        cluster.start_worker(name, wait=False, SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(wait=False)
    cluster.wait_serving()
    texts = [f"steady load item {n}" for n in range(150)]
    expected = {t: from_tensor(stub.Encode(request(MEAN, t)).results[0].dense) for t in texts}  # standalone reference
    answers: dict[str, list] = {t: [] for t in texts}
    errors: list[Exception] = []
    with grpc.insecure_channel(gateway.address) as channel:
        gw = inference_pb2_grpc.InferenceStub(channel)
        workers_seen(gw, MEAN, 3, loaded_on=("w1", "w2", "w3"))

        def client(chunk: list[str]) -> None:
            for text in chunk:
                try:
                    response, call = gw.Encode.with_call(request(MEAN, text), timeout=60)
                    answers[text].append((response, dict(call.trailing_metadata())["x-sie-worker"]))
                except grpc.RpcError as error:
                    errors.append(error)

        threads = [threading.Thread(target=client, args=(texts[i::5],)) for i in range(5)]
        for thread in threads:
            thread.start()
        time.sleep(1.0)
        cluster.processes[1].kill()  # w2, mid-load
        for thread in threads:
            thread.join()
    assert errors == []
    for text, got in answers.items():
        assert len(got) == 1, f"{text} answered {len(got)} times"
        response, _ = got[0]
        assert response.request_id == text
        np.testing.assert_allclose(from_tensor(response.results[0].dense), expected[text], atol=1e-5)
    assert {worker for got in answers.values() for _, worker in got} >= {"w1", "w3"}


def test_scale_from_zero_answers_provisioning_until_a_worker_arrives(cluster, etcd_server, etcd_prefix) -> None:
    gateway = cluster.start_gateway(SIE_GATEWAY_CONFIGURED_GPUS="l4,a100", SIE_GATEWAY_PROVISIONING_RETRY_S="2")
    l4 = (("x-sie-machine-profile", "l4"),)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Encode(request(MEAN, "hello"), metadata=l4, timeout=10)
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_reason(raised.value) == "PROVISIONING"
        assert dict(raised.value.trailing_metadata())["retry-after"] == "2"
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Encode(request(MEAN, "hello"), metadata=(("x-sie-machine-profile", "tpu"),), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(unknown.value) == "UNKNOWN_MACHINE_PROFILE"

    with SIEClient(gateway.address, gpu="l4") as client:
        with pytest.raises(ProvisioningError):
            client.encode(MEAN, "no waiting", wait_for_capacity=False)
        arrival = threading.Timer(2.0, lambda: cluster.start_worker("l4-worker", SIE_MACHINE_PROFILE="l4"))
        arrival.start()
        started = time.monotonic()
        result = client.encode(MEAN, "waits for capacity", provision_timeout_s=120)
        arrival.join()
    assert result["dense"].shape == (32,)
    assert time.monotonic() - started >= 2.0

    async def demand_key():
        from sie_common.cluster.etcd import Etcd

        etcd = Etcd([etcd_server.endpoint], etcd_prefix)
        await etcd.connect()
        try:
            return await etcd.get("demand/l4")
        finally:
            await etcd.close()

    import asyncio

    entry = asyncio.run(demand_key())
    assert entry is not None and json.loads(entry.value)["machine_profile"] == "l4"


def test_pool_requests_reach_only_its_workers_and_an_unrenewed_pool_expires(cluster) -> None:
    """Then, on the same processes, the client's own pool: kept alive past its TTL, left to expire after close."""
    cluster.start_worker("p1", wait=False, SIE_PRELOAD_MODELS=MEAN)
    cluster.start_worker("p2", wait=False, SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(wait=False, SIE_POOLS_ENABLED="true")
    cluster.wait_serving()
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        workers_seen(stub, MEAN, 2, loaded_on=("p1", "p2"))
        pool = stub.CreatePool(inference_pb2.CreatePoolRequest(name="tenant-a", gpus={"default": 1}, ttl_s=3)).pool
        assert pool.ready and len(pool.workers) == 1
        member = pool.workers[0]
        other = ({"p1", "p2"} - {member}).pop()
        wait_until(lambda: (found := pool_in_mirror(stub, "tenant-a")) is not None and found.workers == [member], what="pool in mirror")
        in_pool = (("x-sie-pool", "tenant-a"),)
        assert {served_by(stub.Encode.with_call(request(MEAN, f"in{n}"), metadata=in_pool, timeout=30)) for n in range(8)} == {member}
        assert {served_by(stub.Encode.with_call(request(MEAN, f"out{n}"), timeout=30)) for n in range(8)} == {other}
        with pytest.raises(grpc.RpcError) as exists:
            stub.CreatePool(inference_pb2.CreatePoolRequest(name="tenant-a", gpus={"default": 1}, ttl_s=3))
        assert exists.value.code() == grpc.StatusCode.ALREADY_EXISTS

        # Not renewed: the lease runs out, the pool is gone and its worker is shared again.
        wait_until(lambda: not stub.ListPools(inference_pb2.ListPoolsRequest()).pools, timeout_s=20, what="pool expiry")
        with pytest.raises(grpc.RpcError) as gone:
            stub.Encode(request(MEAN, "late"), metadata=in_pool, timeout=30)
        assert gone.value.code() == grpc.StatusCode.NOT_FOUND
        wait_until(
            lambda: {served_by(stub.Encode.with_call(request(MEAN, f"x{n}"), timeout=30)) for n in range(8)} == {"p1", "p2"},
            what="both workers shared again",
        )

        # The client keeps its pool alive and lets it expire after close.
        client = SIEClient(gateway.address, pool="sdk-pool")
        client.create_pool("sdk-pool", {"default": 1}, ttl_s=2)
        (held,) = stub.GetPool(inference_pb2.GetPoolRequest(name="sdk-pool")).pool.workers
        time.sleep(5)  # well past the TTL: the client renews every ~0.7 s
        assert stub.GetPool(inference_pb2.GetPoolRequest(name="sdk-pool")).pool.workers == [held]
        assert client.encode(MEAN, "inside the pool")["dense"].shape == (32,)
        client.close()
        wait_until(lambda: not stub.ListPools(inference_pb2.ListPoolsRequest()).pools, timeout_s=20, what="expiry after close")


def test_gateway_backpressure_and_static_auth(cluster) -> None:
    cluster.start_worker("slow", wait=False, SIE_PRELOAD_MODELS=MEAN, SIE_ADAPTIVE_BATCHING="false", SIE_MAX_BATCH_WAIT_MS="2000")
    gateway = cluster.start_gateway(wait=False, SIE_GATEWAY_MAX_IN_FLIGHT="1", SIE_AUTH_MODE="static", SIE_AUTH_TOKENS="t0ken,other")
    cluster.wait_serving()
    good = (("authorization", "Bearer t0ken"),)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        with pytest.raises(grpc.RpcError) as missing:
            stub.Encode(request(MEAN, "x"), timeout=10)
        assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as wrong:
            stub.Encode(request(MEAN, "x"), metadata=(("authorization", "Bearer nope"),), timeout=10)
        assert wrong.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "nope" not in gateway.log() and "t0ken" not in gateway.log()
        with pytest.raises(grpc.RpcError) as listing:
            stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10)
        assert listing.value.code() == grpc.StatusCode.UNAUTHENTICATED

        wait_until(
            lambda: stub.GetModel(inference_pb2.GetModelRequest(model=MEAN), metadata=good, timeout=10).model.loaded_on == ["slow"],
            what="worker registered",
        )
        first = threading.Thread(target=lambda: stub.Encode(request(MEAN, "holds the slot"), metadata=good, timeout=30))
        first.start()
        time.sleep(0.7)
        with pytest.raises(grpc.RpcError) as busy:
            stub.Encode(request(MEAN, "second"), metadata=good, timeout=30)
        first.join()
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_reason(busy.value) == "GATEWAY_BUSY"
        assert "retry-after" in dict(busy.value.trailing_metadata())
        assert stub.Encode(request(MEAN, "after"), metadata=good, timeout=30).results


def test_a_pool_for_a_bundle_reserves_only_that_bundles_workers(tmp_path, etcd_server, etcd_prefix, tiny_models, start_config) -> None:
    from local_cluster import Cluster, model_config

    bundles = tmp_path / "bundles"
    bundles.mkdir()
    (bundles / "default.yaml").write_text("id: default\nadapters: [sentence_transformer]\npriority: 0\n")
    (bundles / "other.yaml").write_text("id: other\nadapters: [sentence_transformer]\npriority: 1\n")
    models = [model_config(MEAN, tiny_models[MEAN])]
    cluster = Cluster(tmp_path, etcd_server.endpoint, etcd_prefix, models, lambda: start_config(SIE_BUNDLES_DIR=str(bundles)))
    try:
        # Named so that the first in order (what a pool of any bundle takes) is the default-bundle worker.
        cluster.start_worker("a-default", wait=False, SIE_BUNDLES_DIR=str(bundles), SIE_PRELOAD_MODELS=MEAN)
        cluster.start_worker("b-other", wait=False, SIE_BUNDLES_DIR=str(bundles), SIE_BUNDLE="other", SIE_PRELOAD_MODELS=MEAN)
        gateway = cluster.start_gateway(wait=False, SIE_POOLS_ENABLED="true", **POOLS_MAY_TAKE_EVERY_WORKER)
        cluster.wait_serving()
        with grpc.insecure_channel(gateway.address) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            workers_seen(stub, MEAN, 2, loaded_on=("a-default", "b-other"))
            pool = stub.CreatePool(inference_pb2.CreatePoolRequest(name="other-pool", gpus={"default": 1}, ttl_s=30, bundle="other")).pool
            assert (list(pool.workers), pool.bundle, pool.ready) == (["b-other"], "other", True)
            wait_until(lambda: (found := pool_in_mirror(stub, "other-pool")) is not None and found.bundle == "other", what="pool in mirror")
            in_pool = (("x-sie-pool", "other-pool"),)
            assert {served_by(stub.Encode.with_call(request(MEAN, f"in{n}"), metadata=in_pool, timeout=30)) for n in range(4)} == {"b-other"}
            with pytest.raises(grpc.RpcError) as unknown:
                stub.CreatePool(inference_pb2.CreatePoolRequest(name="nope-pool", gpus={"default": 1}, bundle="gpu-only"))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND and error_reason(unknown.value) == "BUNDLE_NOT_FOUND"
            stub.DeletePool(inference_pb2.DeletePoolRequest(name="other-pool"))
    finally:
        cluster.stop()
        cluster.config.stop()
