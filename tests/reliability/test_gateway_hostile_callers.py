"""Adversarial callers of the gateway, against etcd, the config service, workers and a gateway on loopback:
pools that would reserve every worker, renewals, a control plane with thousands of models, answers over
the message limit, and an EncodeStream caller that never reads its answers.

Each case asserts the exact status and reason, and that the stack still answers a known request after it.
"""

from __future__ import annotations

import threading
import time
import urllib.request

import grpc
import pytest
from google.protobuf import struct_pb2

from grpc_helpers import call_until_loaded, error_info, error_reason
from local_cluster import etcd_call, gateway_model, model_config, served_by, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.cluster import cluster_store, config_store
from sie_common.cluster.etcd import Etcd
from sie_common.cluster.model_config import parse_model_config

MEAN = "test/tiny-mean"
# etcd refuses a transaction of more than 128 operations by default.
WRITES_PER_TXN = 100


def request(text: str, model: str = MEAN) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, request_id=text, items=[types_pb2.Item(text=text)])


def refusal(call) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value


def still_serves(stub: inference_pb2_grpc.InferenceStub) -> None:
    assert list(stub.Encode(request("a known request"), timeout=60).results[0].dense.shape) == [32]


def knows(stub: inference_pb2_grpc.InferenceStub, model: str) -> bool:
    """Whether the gateway or worker behind `stub` has the model's config yet."""
    try:
        return stub.GetModel(inference_pb2.GetModelRequest(model=model), timeout=10).model.id == model
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.NOT_FOUND:
            raise
        return False


def cluster_etcd_call(cluster, use):  # type: ignore[no-untyped-def]
    """Run `use(etcd)` with a client of the cluster's etcd prefix."""
    return etcd_call(cluster.etcd_endpoint, cluster.prefix, use)


def write_models(cluster, weights, model_ids: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Write model configs straight into etcd, many per transaction (as a bulk import would)."""
    values = [
        (config_store.model_name(model_id), config_store.encode_model(parse_model_config(model_config(model_id, weights), source="test")))
        for model_id in model_ids
    ]

    async def write(etcd: Etcd) -> None:
        for start in range(0, len(values), WRITES_PER_TXN):
            await etcd.txn([], [etcd.ops.put(etcd.key(name), value) for name, value in values[start : start + WRITES_PER_TXN]])

    cluster_etcd_call(cluster, write)


def colbert_config(weights) -> dict:  # type: ignore[no-untyped-def]
    """The tiny ColBERT model, its sequences cut at its position table (128)."""
    return model_config(
        "test/tiny-colbert", weights, adapter="colbert", tasks=["encode"], output_types=["multivector", "dense"], max_sequence_length=128
    )


def metric_sum(process, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    """The sum of a metric's samples on a process's /metrics whose labels include `labels`."""
    total = 0.0
    with urllib.request.urlopen(f"{process.metrics_url}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith((name + "{", name + " ")) and all(f'{key}="{value}"' in line for key, value in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_pool_size_ttl_and_per_token_quotas_are_capped(cluster, reliability_report) -> None:
    cluster.start_worker("w1", wait=False, SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(
        wait=False,
        SIE_POOLS_ENABLED="true",
        SIE_POOL_MAX_WORKERS="3",
        SIE_POOL_MAX_TTL_S="120",
        SIE_POOL_QUOTA_WORKERS="3",
        SIE_POOL_TOKEN_QUOTAS="small-token=1",
        SIE_POOL_SHARED_WORKERS="0",  # one worker: pools may take it (by default one of each bundle stays shared)
        SIE_POOL_MAX_SHARE="1",
        SIE_AUTH_MODE="static",
        SIE_AUTH_TOKENS="small-token,big-token",
    )
    cluster.wait_serving()
    small, big = (("authorization", "Bearer small-token"),), (("authorization", "Bearer big-token"),)
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)

        def create(name: str, gpus: dict[str, int], ttl_s: int, metadata) -> inference_pb2.Pool:  # type: ignore[no-untyped-def]
            return stub.CreatePool(inference_pb2.CreatePoolRequest(name=name, gpus=gpus, ttl_s=ttl_s), metadata=metadata, timeout=30).pool

        cases = {
            "every worker": (lambda: create("all", {"default": 1000}, 60, big), grpc.StatusCode.INVALID_ARGUMENT, "POOL_TOO_LARGE"),
            "a lease of 2^31-1 s": (
                lambda: create("forever", {"default": 1}, 2**31 - 1, big),
                grpc.StatusCode.INVALID_ARGUMENT,
                "POOL_TTL_TOO_LONG",
            ),
        }
        for name, (call, code, reason) in cases.items():
            refused = refusal(call)
            reliability_report.add(
                "adversarial gateway", f"CreatePool for {name}", status=refused.code().name, reason=error_reason(refused)
            )
            assert refused.code() == code and error_reason(refused) == reason
            assert "3" in refused.details() or "120" in refused.details()  # the message names the limit

        # A token with its own quota of 1: one pool of one worker, then refused.
        assert create("small-1", {"default": 1}, 60, small).workers == ["w1"]
        over = refusal(lambda: create("small-2", {"default": 1}, 60, small))
        assert over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(over) == "POOL_QUOTA_EXCEEDED"
        # Another token keeps the default quota (3): its pools are counted apart.
        assert create("big-1", {"default": 2}, 60, big).name == "big-1"
        also_over = refusal(lambda: create("big-2", {"default": 2}, 60, big))
        assert also_over.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(also_over) == "POOL_QUOTA_EXCEEDED"
        reliability_report.add("adversarial gateway", "CreatePool over a token's quota", status=over.code().name, reason=error_reason(over))
        # Deleting a pool gives its quota back.
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="small-1"), metadata=small, timeout=30)
        assert create("small-2", {"default": 1}, 60, small).workers == ["w1"]
        wait_until(
            lambda: stub.GetPool(inference_pb2.GetPoolRequest(name="small-2"), metadata=small, timeout=30).pool.ready, what="pool in mirror"
        )
        assert stub.Encode(request("a known request"), metadata=(*small, ("x-sie-pool", "small-2")), timeout=60).results

        # Concurrent creations cannot overshoot a quota: of 8 one-worker pools at once, at most 3 (big's quota) exist after.
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="big-1"), metadata=big, timeout=30)
        outcomes: list[grpc.StatusCode] = []

        def race(index: int) -> None:
            try:
                create(f"race-{index}", {"default": 1}, 60, big)
                outcomes.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                outcomes.append(error.code())

        threads = [threading.Thread(target=race, args=(index,)) for index in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

        async def stored_pools(etcd: Etcd) -> set[str]:
            return {entry.name.removeprefix(cluster_store.POOLS) for entry in (await etcd.read_prefix(cluster_store.POOLS))[0]}

        created = sorted(name for name in cluster_etcd_call(cluster, stored_pools) if name.startswith("race-"))
        reliability_report.add("adversarial gateway", "8 concurrent CreatePool against a quota of 3", created=len(created))
        assert 1 <= len(created) <= 3 and outcomes.count(grpc.StatusCode.OK) == len(created)
        assert set(outcomes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED}


def test_renew_pool_succeeds_and_saves_a_newly_registered_worker(cluster, reliability_report) -> None:
    cluster.start_worker("r1", SIE_PRELOAD_MODELS=MEAN)
    # Pools may take every worker here (by default one of each bundle stays shared, and a pool holds half).
    gateway = cluster.start_gateway(SIE_POOLS_ENABLED="true", SIE_POOL_SHARED_WORKERS="0", SIE_POOL_MAX_SHARE="1")
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: gateway_model(stub, MEAN).loaded_on == ["r1"], what="r1 registered")
        pool = stub.CreatePool(inference_pb2.CreatePoolRequest(name="grow", gpus={"default": 2}, ttl_s=30), timeout=30).pool
        assert list(pool.workers) == ["r1"] and not pool.ready
        cluster.start_worker("r2", SIE_PRELOAD_MODELS=MEAN)
        wait_until(lambda: "r2" in gateway_model(stub, MEAN).loaded_on, what="r2 registered")

        renewed = stub.RenewPool(inference_pb2.RenewPoolRequest(name="grow"), timeout=30).pool
        reliability_report.add("adversarial gateway", "RenewPool tops up", workers=",".join(renewed.workers), ready=renewed.ready)
        assert sorted(renewed.workers) == ["r1", "r2"] and renewed.ready

        async def stored(etcd: Etcd) -> cluster_store.PoolRecord:
            entry = await etcd.get(cluster_store.POOLS + "grow")
            assert entry is not None
            return cluster_store.decode_pool(entry.value)

        assert sorted(cluster_etcd_call(cluster, stored).workers) == ["r1", "r2"]
        wait_until(
            lambda: sorted(stub.GetPool(inference_pb2.GetPoolRequest(name="grow"), timeout=30).pool.workers) == ["r1", "r2"],
            what="pool in mirror",
        )
        in_pool = (("x-sie-pool", "grow"),)
        assert stub.Encode(request("inside the pool"), metadata=in_pool, timeout=60).results
        missing = refusal(lambda: stub.RenewPool(inference_pb2.RenewPoolRequest(name="never-made"), timeout=30))
        assert missing.code() == grpc.StatusCode.NOT_FOUND and error_reason(missing) == "POOL_NOT_FOUND"


def test_a_model_added_after_2500_reaches_the_gateway_at_the_cost_of_one(cluster, tiny_models, reliability_report) -> None:
    """First, among the first 1,000 of them, MODEL_NOT_FOUND has a short message (at the gateway and the worker)."""
    worker = cluster.start_worker("m1", wait=False, SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(wait=False)
    cluster.wait_serving()
    bulk = [f"bulk/model-{index:04d}" for index in range(2500)]
    write_models(cluster, tiny_models[MEAN], bulk[:1000])
    with gateway.channel() as gateway_channel, worker.channel() as worker_channel:
        stub = inference_pb2_grpc.InferenceStub(gateway_channel)
        direct = inference_pb2_grpc.InferenceStub(worker_channel)
        wait_until(lambda: knows(stub, "bulk/model-0999"), what="the models at the gateway")
        wait_until(lambda: knows(direct, "bulk/model-0999"), what="the models at the worker")
        for where, target in (("gateway", stub), ("worker", direct)):
            missing = refusal(lambda target=target: target.Encode(request("x", model="no/such-model"), timeout=30))
            reliability_report.add(
                "adversarial gateway",
                f"MODEL_NOT_FOUND among 1,000 models ({where})",
                status=missing.code().name,
                message_bytes=len(missing.details()),
            )
            assert missing.code() == grpc.StatusCode.NOT_FOUND and error_reason(missing) == "MODEL_NOT_FOUND"
            assert len(missing.details()) < 1000 and " in all)" in missing.details()
        still_serves(stub)

    write_models(cluster, tiny_models[MEAN], bulk[1000:])
    with gateway.channel() as channel, cluster.config.channel() as config_channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: knows(stub, "bulk/model-2499"), timeout_s=120, what="2,500 models at the gateway")
        wait_until(lambda: "m1" in gateway_model(stub, MEAN).rollouts[0].current_workers, timeout_s=120, what="the worker caught up")
        before = metric_sum(gateway, "sie_gateway_config_entries_decoded_total")

        added = "late/model"
        admin = config_pb2_grpc.ConfigServiceStub(config_channel)
        admin.AddModel(config_pb2.AddModelRequest(config=model_config(added, tiny_models[MEAN])), timeout=30)
        wait_until(lambda: knows(stub, added), timeout_s=30, what="the new model at the gateway")
        decoded = metric_sum(gateway, "sie_gateway_config_entries_decoded_total") - before
        reliability_report.add("adversarial gateway", "one model added after 2,500", values_decoded_by_gateway=decoded)
        assert decoded == 1  # that one config, not the 2,503 others

        # The worker follows one change at a time too, and its bundle hash agrees with the gateway's and the config service's.
        bundle = admin.GetBundle(config_pb2.GetBundleRequest(bundle_id="default"), timeout=30).bundle
        wait_until(
            lambda: gateway_model(stub, added).rollouts[0].current_workers == ["m1"], timeout_s=30, what="the worker's hash caught up"
        )
        assert gateway_model(stub, added).rollouts[0].config_hash == bundle.config_hash
        reply, _ = call_until_loaded(lambda: stub.Encode(request("routed", model=added), timeout=60))
        assert list(reply.results[0].dense.shape) == [32]
        assert worker.process.poll() is None
        still_serves(stub)


def test_an_answer_over_the_message_limit_is_refused_and_breaks_no_work_stream(cluster, tiny_models, reliability_report) -> None:
    workers = [
        cluster.start_worker(name, wait=False, SIE_PRELOAD_MODELS=MEAN, SIE_MAX_SEND_MESSAGE_BYTES=str(256 * 1024)) for name in ("o1", "o2")
    ]
    gateway = cluster.start_gateway(wait=False, SIE_MAX_SEND_MESSAGE_BYTES=str(64 * 1024))
    cluster.wait_serving()
    sized = "sized/mean"  # the same weights, with dims in its config: its answer's size is known up front
    colbert = "test/tiny-colbert"  # multivectors: no estimate, the answer is measured once computed
    with cluster.config.channel() as config_channel:
        admin = config_pb2_grpc.ConfigServiceStub(config_channel)
        admin.AddModel(config_pb2.AddModelRequest(config=model_config(sized, tiny_models[MEAN], dims=32)), timeout=30)
        admin.AddModel(config_pb2.AddModelRequest(config=colbert_config(tiny_models[colbert])), timeout=30)
    long_text = " ".join(f"word{n}" for n in range(120))
    multivectors = inference_pb2.EncodeRequest(model=colbert, output_types=["multivector"], items=[types_pb2.Item(text=long_text)] * 40)

    def streams() -> float:
        return sum(metric_sum(worker, "sie_worker_work_streams_total") for worker in workers)

    def encodes() -> float:
        return sum(metric_sum(worker, "sie_worker_requests_total", operation="encode") for worker in workers)

    def many(count: int, model: str = MEAN) -> inference_pb2.EncodeRequest:
        return inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=f"item {n}") for n in range(count)])

    with gateway.channel() as channel, workers[0].channel() as worker_channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: sorted(gateway_model(stub, MEAN).loaded_on) == ["o1", "o2"], what="both workers registered")
        wait_until(lambda: knows(stub, sized), what="the sized model at the gateway")
        wait_until(
            lambda: len({served_by(stub.Encode.with_call(request(f"warm {n}"), timeout=60)) for n in range(8)}) == 2,
            what="both streams open",
        )
        wait_until(lambda: knows(stub, colbert), what="colbert at the gateway")
        call_until_loaded(lambda: stub.Encode(inference_pb2.EncodeRequest(model=colbert, items=[types_pb2.Item(text="load")]), timeout=60))
        opened = streams()
        cases = [
            # name, call, limit named, whether a worker computed it
            ("over the gateway's limit (measured at the gateway)", lambda: stub.Encode(many(1000), timeout=120), "65536", 1),
            ("over the worker's limit (measured at the worker)", lambda: stub.Encode(multivectors, timeout=120), "262144", 1),
            (
                "known too large from the loaded model's dims (refused by the worker)",
                lambda: stub.Encode(many(3000), timeout=120),
                "262144",
                1,
            ),
            ("known too large from dims (refused by the gateway)", lambda: stub.Encode(many(1000, sized), timeout=120), "65536", 0),
            (
                "known too large from dims (refused by the worker itself)",
                lambda: inference_pb2_grpc.InferenceStub(worker_channel).Encode(many(3000, sized), timeout=120),
                "262144",
                1,
            ),
        ]
        for name, call, limit, computed in cases:
            before = encodes()
            refused = refusal(call)
            wait_until(lambda before=before, computed=computed: encodes() - before >= computed, what="the worker's count")
            answered_by_workers = encodes() - before
            reliability_report.add(
                "adversarial gateway",
                f"answer {name}",
                status=refused.code().name,
                reason=error_reason(refused),
                worker_requests=answered_by_workers,
            )
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error_reason(refused) == "RESPONSE_TOO_LARGE"
            assert limit in refused.details()
            assert answered_by_workers == computed  # never retried on another worker
        # The stack still answers, on the streams it had (none broke), and each worker still answers.
        assert {served_by(stub.Encode.with_call(request(f"after {n}"), timeout=60)) for n in range(12)} <= {"o1", "o2"}
        assert streams() == opened
        for worker in workers:
            with worker.channel() as direct:
                assert inference_pb2_grpc.InferenceStub(direct).Encode(request("direct"), timeout=60).results
        reliability_report.add("adversarial gateway", "Work streams broken by oversized answers", broken=streams() - opened)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmRSS:"))


# Growth of the gateway's resident memory allowed while a caller never reads its EncodeStream answers.
RSS_BOUND_MB = 150
# Requests the never-reading caller may send (each ~60 KB, answered with ~800 KB): bounds the case on a server without flow control.
MAX_SENT = 1000
# How long the never-reading caller's sender must have sent nothing more before the gateway's memory is judged.
HELD_BACK_S = 5.0


def test_an_encode_stream_reader_that_never_reads_holds_back_its_sender_not_the_gateway(cluster, tiny_models, reliability_report) -> None:
    colbert = "test/tiny-colbert"
    with cluster.config.channel() as config_channel:
        config_pb2_grpc.ConfigServiceStub(config_channel).AddModel(
            config_pb2.AddModelRequest(config=colbert_config(tiny_models[colbert])), timeout=30
        )
    cluster.start_worker("e1", wait=False, SIE_PRELOAD_MODELS=colbert)
    gateway = cluster.start_gateway(wait=False, SIE_ENCODE_STREAM_WINDOW="8")
    cluster.wait_serving()
    # 100 texts of ~128 tokens: each answer holds ~800 KB of multivectors.
    text = " ".join(f"word{n}" for n in range(120))
    big = inference_pb2.EncodeRequest(model=colbert, output_types=["multivector"], items=[types_pb2.Item(text=text) for _ in range(100)])
    sent = 0
    stop = threading.Event()

    def requests():  # type: ignore[no-untyped-def]
        nonlocal sent
        while sent < MAX_SENT and not stop.is_set():
            sent += 1
            yield inference_pb2.EncodeStreamRequest(request=big)

    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: knows(stub, colbert) and gateway_model(stub, colbert).loaded_on == ["e1"], timeout_s=60, what="colbert loaded")
        assert stub.Encode(big, timeout=60).results  # warm: the gateway has routed one such answer
        pid = gateway.process.pid
        baseline = rss_mb(pid)
        call = stub.EncodeStream(requests(), timeout=120)  # its answers are never read
        # Watched until the sender has been held back for HELD_BACK_S (what the window and flow control should do
        # within seconds), at most 15 s: a gateway that kept reading would let it run on to MAX_SENT.
        peak, began = baseline, time.monotonic()
        last_sent, held_since = sent, began
        while time.monotonic() - began < 15 and time.monotonic() - held_since < HELD_BACK_S:
            peak = max(peak, rss_mb(pid))
            time.sleep(0.25)
            if sent != last_sent:
                last_sent, held_since = sent, time.monotonic()
        watched_s = time.monotonic() - began
        sent_while_unread = sent
        call.cancel()
        stop.set()
        time.sleep(3)
        after = rss_mb(pid)
        reliability_report.add(
            "adversarial gateway",
            "EncodeStream never read",
            requests_sent=sent_while_unread,
            watched_s=round(watched_s, 1),
            rss_growth_mb=round(peak - baseline),
            after_cancel_mb=round(after - baseline),
            bound_mb=RSS_BOUND_MB,
        )
        assert peak - baseline < RSS_BOUND_MB
        assert after - baseline < RSS_BOUND_MB
        assert sent_while_unread < MAX_SENT  # flow control reached back: the sender was held back
        assert stub.Encode(big, timeout=60).results


def test_the_gateway_refuses_fields_over_their_bounds_before_routing(cluster, reliability_report) -> None:
    """Bounds on a message's own fields are the gateway's too: with tighter ones than its worker's, the
    gateway's answer shows it checked them, before it looked the model up or routed anything. And pool creation is
    off unless the operator turns it on (the same processes: pools are off by default whatever the bounds)."""
    cluster.start_worker("b1", wait=False, SIE_PRELOAD_MODELS=MEAN)
    gateway = cluster.start_gateway(wait=False, SIE_MAX_ITEMS_PER_REQUEST="4", SIE_MAX_TEXT_BYTES="64", SIE_MAX_OPTIONS_DEPTH="2")
    cluster.wait_serving()
    nested = struct_pb2.Struct()
    nested.update({"a": {"b": {"c": 1}}})
    cases = {
        # No model of that name exists: over a bound is said before NOT_FOUND would be.
        "TOO_MANY_ITEMS": lambda stub: stub.Encode(
            inference_pb2.EncodeRequest(model="nobody/has-this", items=[types_pb2.Item(text="x")] * 5), timeout=30
        ),
        # The worker's own bound (2 MiB) would take this text: only the gateway's refuses it.
        "TEXT_TOO_LONG": lambda stub: stub.Encode(request("y" * 65), timeout=30),
        "NAME_TOO_LONG": lambda stub: stub.Encode(request("x", model="m" * 300), timeout=30),
        "OPTIONS_TOO_LARGE": lambda stub: stub.Encode(
            inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")], options=nested), timeout=30
        ),
        "INVALID_THRESHOLD": lambda stub: stub.Extract(
            inference_pb2.ExtractRequest(model="nobody/has-this", items=[types_pb2.Item(text="x")], threshold=float("nan")), timeout=30
        ),
    }
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: gateway_model(stub, MEAN).loaded_on == ["b1"], what="worker registered")
        for reason, call in cases.items():
            refused = refusal(lambda call=call: call(stub))
            reliability_report.add("adversarial gateway", f"field over its bound at the gateway ({reason})", status=refused.code().name)
            assert (refused.code(), error_reason(refused)) == (grpc.StatusCode.INVALID_ARGUMENT, reason)
        assert error_info(refusal(lambda: cases["TEXT_TOO_LONG"](stub))).metadata["setting"] == "SIE_MAX_TEXT_BYTES"
        still_serves(stub)

        refused = refusal(
            lambda: stub.CreatePool(inference_pb2.CreatePoolRequest(name="all", gpus={"default": 1000}, ttl_s=2**31 - 1), timeout=30)
        )
        reliability_report.add("adversarial gateway", "CreatePool with pools off", status=refused.code().name, reason=error_reason(refused))
        assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION and error_reason(refused) == "POOLS_DISABLED"
        assert not stub.ListPools(inference_pb2.ListPoolsRequest(), timeout=30).pools
        still_serves(stub)
