"""The local stack's etcd as someone else on the host finds it (issue 32, defect 3), on a real `sie up`.

Before, etcd took writes from anyone: a fake worker written under `workers/`
got traffic within 2 s, the gateway sent it its SIE_WORKER_TOKEN, a caller's
text reached it and the caller got its forged vector; configs written straight
to etcd skipped the admin token. Now `sie up`'s etcd takes connections only
with the run's client certificate, and requests only from its users: each
service signs in as its own. Against it, with no certificate, with the
certificate but no credential, and with each service's credential where that
service must not write: registering a worker, writing a model config, reading
the users, and etcd 3.5's way round its own authentication (raise a NOSPACE
alarm, then turn authentication off). Each refused write must leave etcd as it
was, and a forged worker must get nothing.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
import pytest
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from aetcd import rpc
from sie_common.cluster.cluster_store import WorkerRecord, encode_worker
from sie_up_process import PREFIX, RawEtcd, SieUp

# Starts processes (a `sie up` of its own) in fixtures of its own.
pytestmark = pytest.mark.process

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DIMS = 384
FORGED_VALUE = 7.0
SECTION = "etcd authentication"
# Who tries to write: without the stack's client certificate, with it but no etcd user, or as a user.
NO_CERTIFICATE = "anyone on the host"
INTRUDERS = {
    NO_CERTIFICATE: None,
    "a process with the certificate only": None,
    "the gateway's user": "sie-gateway",
    "worker-0's user": "sie-worker-0",
}
# What etcd answers each of them when it refuses.
REFUSED = {
    NO_CERTIFICATE: grpc.StatusCode.UNAVAILABLE,  # the TLS handshake fails
    # etcd takes the certificate's name ("sie up service") as the user, and no such user may do anything
    "a process with the certificate only": grpc.StatusCode.PERMISSION_DENIED,
    "the gateway's user": grpc.StatusCode.PERMISSION_DENIED,
    "worker-0's user": grpc.StatusCode.PERMISSION_DENIED,  # it may write its own key only
}


class ForgedWorker(worker_pb2_grpc.WorkerServicer):
    """A Work server that records who connects and what they send, and answers every encode with 7.0s."""

    def __init__(self) -> None:
        self.streams: list[dict[str, str]] = []
        self.texts: list[str] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        worker_pb2_grpc.add_WorkerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def Work(self, request_iterator, context):  # noqa: N802 - the gRPC method's name
        self.streams.append(dict(context.invocation_metadata()))
        for request in request_iterator:
            if request.HasField("encode"):
                self.texts += [item.text for item in request.encode.items]
                forged = types_pb2.Tensor(
                    dtype="float32", shape=[DIMS], data=np.full(DIMS, FORGED_VALUE, "<f4").tobytes()
                )
                results = [inference_pb2.EncodeResult(id=item.id, dense=forged) for item in request.encode.items]
                yield worker_pb2.WorkResponse(
                    request_id=request.request_id,
                    worker_id="forged",
                    encode=inference_pb2.EncodeResponse(model=MODEL, results=results),
                )

    def record(self, worker_id: str) -> bytes:
        """A registration as attractive as a real worker's: the demo model loaded, idle, plenty of room."""
        return encode_worker(
            WorkerRecord(
                worker_id=worker_id, address=f"127.0.0.1:{self.port}", bundle="default", machine_profile="default",
                loaded_models=frozenset({MODEL}), free_capacity=512,
            )
        )  # fmt: skip


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SieUp]:
    running = SieUp.start(tmp_path_factory.mktemp("etcd-auth-stack"), workers=1)
    try:
        running.wait_up()
        yield running
    finally:
        running.stop()


def intruder(stack: SieUp, who: str) -> RawEtcd:
    """A client as `who` (an INTRUDERS key, or "root"); with no credential or certificate where the stack keeps
    none (a stack without etcd TLS or users, where everyone is anyone)."""
    user = "root" if who == "root" else INTRUDERS[who]
    tls = None if who == NO_CERTIFICATE else stack.tls()
    return RawEtcd(stack.etcd, user, stack.password(user) if user else None, tls)


def root(stack: SieUp) -> RawEtcd:
    return intruder(stack, "root")


def without_credential(stack: SieUp) -> RawEtcd:
    return RawEtcd(stack.etcd, tls=stack.tls())


def stable(contents: dict[str, bytes]) -> dict[str, bytes]:
    """etcd's contents but for what changes on its own (worker-0 refreshes its record; demand leases lapse)."""
    return {
        key: value for key, value in contents.items() if not key.startswith((PREFIX + "workers/", PREFIX + "demand/"))
    }


def encode_through_gateway(stack: SieUp, count: int, seconds: float) -> list[np.ndarray]:
    """`count` encode requests spread over `seconds`, each with a caller's text; their vectors."""
    vectors = []
    with grpc.insecure_channel(stack.gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for index in range(count):
            request = inference_pb2.EncodeRequest(
                model=MODEL, items=[types_pb2.Item(text=f"a caller's secret {index}")]
            )
            result = stub.Encode(request, timeout=60).results[0].dense
            vectors.append(np.frombuffer(result.data, "<f4") if result.data else np.asarray(result.values, "<f4"))
            time.sleep(seconds / count)
    return vectors


def test_a_forged_worker_registration_is_refused_and_the_forged_worker_gets_no_traffic_and_no_token(
    stack: SieUp, reliability_report
) -> None:
    forged = ForgedWorker()
    try:
        refusals = {}
        for index, who in enumerate(INTRUDERS):
            etcd = intruder(stack, who)
            try:
                refusals[who] = etcd.put(f"{PREFIX}workers/forged-{index}", forged.record(f"forged-{index}"))
            finally:
                etcd.close()
        # Give the gateway time to see a registration (it used to route to one within 2 s), then call it.
        time.sleep(3)
        vectors = encode_through_gateway(stack, count=20, seconds=4)

        assert forged.streams == [], "the gateway opened a Work stream to the forged worker"
        assert forged.texts == [], "a caller's text reached the forged worker"
        assert all(v.shape == (DIMS,) and not np.allclose(v, FORGED_VALUE) for v in vectors), (
            "a caller got the forged vector"
        )
        assert len({v.tobytes() for v in vectors}) == len(vectors)  # real embeddings of different texts
        for who, code in refusals.items():
            reliability_report.add(SECTION, f"{who} registers a worker", expected="refused", actual=code.name)
        assert refusals == REFUSED
        etcd = root(stack)
        try:
            assert sorted(etcd.read(PREFIX + "workers/")) == [PREFIX + "workers/worker-0"]
        finally:
            etcd.close()
    finally:
        forged.server.stop(grace=None)


@pytest.mark.parametrize("who", sorted(INTRUDERS))
def test_a_model_config_written_straight_to_etcd_is_refused_and_etcd_is_left_unchanged(stack: SieUp, who: str) -> None:
    """The config service is the only writer of what workers load: no other credential may write models/."""
    admin = root(stack)
    etcd = intruder(stack, who)
    try:
        before = stable(admin.read())
        evil = (
            b'{"id": "evil/model", "hf_id": "evil/model", "profiles": {"default": {"adapter": "sentence_transformer"}}}'
        )
        attempts = {
            "add a model": etcd.put(PREFIX + "models/evil/model", evil),
            "change the demo model": etcd.put(f"{PREFIX}models/{MODEL}", evil),
            "delete the demo model": etcd.delete(f"{PREFIX}models/{MODEL}"),
            "move the epoch": etcd.put(PREFIX + "epoch", b"evil/model"),
            "take the config leader's key": etcd.put(PREFIX + "config/leader", b'{"replica": "evil"}'),
            "rewrite a bundle": etcd.put(PREFIX + "bundles/default", b"{}"),
        }
        assert attempts == dict.fromkeys(attempts, REFUSED[who])
        assert stable(admin.read()) == before
        assert PREFIX + "models/evil/model" not in before and f"{PREFIX}models/{MODEL}" in before
    finally:
        etcd.close()
        admin.close()
    with grpc.insecure_channel(stack.gateway) as channel:  # what the gateway serves is unchanged too
        models = inference_pb2_grpc.InferenceStub(channel).ListModels(inference_pb2.ListModelsRequest(), timeout=30)
    assert "evil/model" not in {model.id for model in models.models}


def test_etcd_users_and_passwords_stay_private(stack: SieUp) -> None:
    # On disk: only this user may read the password files.
    assert stat.S_IMODE(os.stat(stack.credentials).st_mode) == 0o700
    files = sorted(path.name for path in stack.credentials.iterdir())
    assert files == ["root", "sie-config", "sie-gateway", "sie-worker-0"]
    for name in files:
        assert stat.S_IMODE(os.stat(stack.credentials / name).st_mode) == 0o600, name
    tls = stack.state / "etcd-tls"  # and the certificates: no CA key is kept, so nothing more can be signed
    assert stat.S_IMODE(os.stat(tls).st_mode) == 0o700
    names = ["ca.pem", "client-key.pem", "client.pem", "server-key.pem", "server.pem"]
    assert sorted(path.name for path in tls.iterdir()) == names
    assert all(stat.S_IMODE(os.stat(path).st_mode) == 0o600 for path in tls.iterdir())
    # In etcd: nobody without a credential, and no service's user, may list the users or read another's keys.
    for who in INTRUDERS:
        etcd = intruder(stack, who)
        try:
            assert isinstance(etcd.list_users(), grpc.StatusCode), f"{who} listed the users"
            contents = etcd.read()
            assert isinstance(contents, grpc.StatusCode), f"{who} read the whole prefix"
        finally:
            etcd.close()
    # Nowhere else: no password in etcd's keys, the logs, or a process's command line or environment.
    passwords = [password for name in files if (password := stack.password(name))]
    assert len(passwords) == len(files)
    etcd = root(stack)
    try:
        assert not any(password.encode() in value for value in etcd.read().values() for password in passwords)
    finally:
        etcd.close()
    for log in (stack.state / "logs").iterdir():
        text = log.read_text(errors="replace")
        assert not any(password in text for password in passwords), log.name
    import psutil

    for child in psutil.Process(stack.process.pid).children(recursive=True):
        seen = " ".join(child.cmdline()) + " ".join(child.environ().values())
        assert not any(password in seen for password in passwords), child.cmdline()


def test_etcds_alarm_cannot_be_used_to_turn_its_authentication_off(stack: SieUp, reliability_report) -> None:
    """etcd 3.5 (the one `sie up` runs) answers Alarm without a credential, and with a NOSPACE alarm raised it
    applies AuthDisable unchecked: three calls open it to anyone. Without the stack's client certificate nobody
    gets to make them."""
    etcd = intruder(stack, NO_CERTIFICATE)
    try:
        raised = etcd.alarm(rpc.AlarmRequest.ACTIVATE)
        disabled = etcd.disable_auth()
        cleared = etcd.alarm(rpc.AlarmRequest.DEACTIVATE)
        forged = etcd.put(PREFIX + "workers/forged-after-alarm", b"{}")
    finally:
        etcd.close()
    reliability_report.add(
        SECTION,
        "anyone on the host: NOSPACE alarm, then AuthDisable",
        expected="refused",
        actual=f"{raised.name}, {disabled.name}",
    )
    assert (raised, disabled, cleared, forged) == (grpc.StatusCode.UNAVAILABLE,) * 4
    admin = root(stack)
    try:
        assert admin.alarms() == []
        assert PREFIX + "workers/forged-after-alarm" not in admin.read(PREFIX + "workers/")
    finally:
        admin.close()
    anyone = without_credential(stack)
    try:
        assert anyone.read() == grpc.StatusCode.PERMISSION_DENIED  # authentication is still on
    finally:
        anyone.close()
