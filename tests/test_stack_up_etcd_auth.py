"""`sie up` with etcd authentication on works as before: with inference tokens and pools on, and with a second
stack started while the first runs (each with its own etcd users)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_up_process import PREFIX, RawEtcd, SieUp

# Starts processes (`sie up` stacks of their own) in fixtures of its own.
pytestmark = pytest.mark.process

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
TOKEN = "stack-test-token"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SieUp]:
    """Two workers, inference tokens and pools on."""
    env = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": TOKEN, "SIE_POOLS_ENABLED": "true"}
    running = SieUp.start(tmp_path_factory.mktemp("secured-stack"), workers=2, env=env)
    try:
        running.wait_up()
        yield running
    finally:
        running.stop()


def http_encode(stack: SieUp, token: str | None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{stack.http}/v1/encode/{MODEL}",
        data=json.dumps({"items": [{"text": "hello"}]}).encode(),
        headers={"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def pool_keys(stack: SieUp) -> list[str]:
    etcd = RawEtcd(stack.etcd, "root", stack.password("root"), stack.tls())
    try:
        contents = etcd.read(PREFIX + "pools/")
    finally:
        etcd.close()
    assert isinstance(contents, dict)
    return sorted(contents)


def test_inference_tokens_and_pools_work_with_etcd_authentication_on(secured: SieUp) -> None:
    status, body = http_encode(secured, None)
    assert status == 401, body
    status, body = http_encode(secured, TOKEN)
    assert status == 200 and len(body["results"][0]["dense"]["values"]) == 384, body

    metadata = (("authorization", f"Bearer {TOKEN}"),)
    with grpc.insecure_channel(secured.gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        # The gateway's etcd user writes pools/ (and only the gateway's may).
        created = stub.CreatePool(
            inference_pb2.CreatePoolRequest(name="team-a", gpus={"default": 1}, ttl_s=120),
            metadata=metadata,
            timeout=30,
        ).pool
        assert created.name == "team-a" and dict(created.gpus) == {"default": 1}
        assert pool_keys(secured) == [PREFIX + "pools/team-a"]
        pool = stub.GetPool(inference_pb2.GetPoolRequest(name="team-a"), metadata=metadata, timeout=30).pool
        assert pool.ready and len(pool.workers) == 1
        request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text="in the pool")])
        answer = stub.Encode(request, metadata=(*metadata, ("x-sie-pool", "team-a")), timeout=60)
        assert answer.results[0].dense.shape == [384] or len(answer.results[0].dense.values) == 384
        renewed = stub.RenewPool(inference_pb2.RenewPoolRequest(name="team-a"), metadata=metadata, timeout=30).pool
        assert renewed.name == "team-a"
        stub.DeletePool(inference_pb2.DeletePoolRequest(name="team-a"), metadata=metadata, timeout=30)
        assert pool_keys(secured) == []
        with pytest.raises(grpc.RpcError) as missing:
            stub.GetPool(inference_pb2.GetPoolRequest(name="team-a"), metadata=metadata, timeout=30)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_second_stack_started_while_one_runs_serves_with_etcd_users_of_its_own(secured: SieUp, tmp_path) -> None:
    second = SieUp.start(tmp_path, workers=1)
    try:
        banner = second.wait_up()
        assert (
            f"(client certificates in {second.state / 'etcd-tls'}; users' passwords in {second.credentials})" in banner
        )
        status, body = http_encode(second, None)
        assert status == 200 and len(body["results"][0]["dense"]["values"]) == 384, body
        status, _ = http_encode(secured, TOKEN)
        assert status == 200
        # Each stack made its own certificates and users: the second's open nothing of the first's etcd.
        assert second.tls() != secured.tls()
        for user in ("root", "sie-gateway"):
            assert second.password(user) != secured.password(user)
            with pytest.raises(grpc.RpcError) as refused:
                RawEtcd(secured.etcd, user, second.password(user), second.tls())
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # its certificate is not from the first's CA
            with pytest.raises(grpc.RpcError) as refused:
                RawEtcd(secured.etcd, user, second.password(user), secured.tls())
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "authentication failed" in (refused.value.details() or "")
    finally:
        second.stop()
    status, _ = http_encode(secured, TOKEN)  # the first stack keeps serving once the second is gone
    assert status == 200
