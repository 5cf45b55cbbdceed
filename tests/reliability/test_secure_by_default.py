"""Secure by default, against real processes: admin writes are off until an operator turns them on,
remote code needs its own setting (on the config service, and on each worker), workers check tokens
on Inference and on the internal Work stream, config reads need the admin token, a token is checked
before anything looks at the request, and `sie up` starts with both kinds of token and enforces them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import struct_pb2

from grpc_helpers import bearer, call_until_loaded, error_details, error_info
from stack_process import stop_stack
from local_cluster import Cluster, model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2, worker_pb2, worker_pb2_grpc
from sie_common.cluster.etcd import Etcd
from worker_process import free_port
from sie_stack.up import DEMO_MODEL, wait_for_leader
from worker_process import WorkerProcess

MEAN = "test/tiny-mean"
ADMIN_TOKEN = "admin-tok-91c3"
INFERENCE_TOKEN = "inference-tok-2d7e"
WORKER_TOKEN = "worker-tok-55af"
WRONG_TOKEN = "wrong-tok-0e41"
SECTION = "adversarial: auth"


def remote_code_config(model_id: str, weights: Path | None = None) -> dict:
    """A config whose profile would run Python shipped with the weights (a Hub repo unless `weights`)."""
    config = {"id": model_id, "profiles": {"default": {"adapter": "sentence_transformer", "load_options": {"trust_remote_code": True}}}}
    return {**config, "path": str(weights)} if weights else {**config, "hf_id": "attacker/model-with-code"}


def failure(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    """The status and ErrorInfo reason a call failed with (OK, "" when it succeeded)."""
    try:
        call()
    except grpc.RpcError as error:
        info, _ = error_details(error)
        return error.code(), info.reason if info else ""
    return grpc.StatusCode.OK, ""


async def stored_models(etcd: Etcd) -> list[str]:
    entries, _ = await etcd.read_prefix("models/")
    return [entry.name for entry in entries]


# -- admin writes (defect 3) ----------------------------------------------------------------------


async def test_a_config_service_without_an_admin_token_refuses_every_write(start_config, etcd: Etcd, reliability_report) -> None:
    config = start_config(SIE_ALLOW_UNAUTHENTICATED_ADMIN="false")  # the defaults: no token, no opt-in
    with grpc.insecure_channel(config.address) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        wait_for_leader(admin)
        request = config_pb2.AddModelRequest(config=remote_code_config("attacker/remote-code"))
        for presented, metadata in [("no token", ()), ("a made-up token", bearer(WRONG_TOKEN))]:
            with pytest.raises(grpc.RpcError) as refused:
                admin.AddModel(request, metadata=metadata, timeout=30)
            reliability_report.add(SECTION, f"default config service: AddModel with {presented}", expected="PERMISSION_DENIED ADMIN_DISABLED",
                                   actual=f"{refused.value.code().name} {error_info(refused.value).reason}")
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_info(refused.value).reason == "ADMIN_DISABLED"
            assert "SIE_ADMIN_TOKEN" in refused.value.details() and "SIE_ALLOW_UNAUTHENTICATED_ADMIN" in refused.value.details()
        assert await stored_models(etcd) == []
        assert admin.GetEpoch(config_pb2.GetEpochRequest(), timeout=10).epoch == 0  # reads still answer
    assert "admin writes: disabled" in config.log()


def test_the_unauthenticated_dev_mode_refuses_to_start_off_loopback(etcd_server, reliability_report) -> None:
    env = {**os.environ, "SIE_ALLOW_UNAUTHENTICATED_ADMIN": "true", "SIE_HOST": "0.0.0.0", "SIE_ETCD_ENDPOINTS": etcd_server.endpoint}
    result = subprocess.run(
        [sys.executable, "-m", "sie_config", "serve", "--port", str(free_port()), "--metrics-port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    reliability_report.add(SECTION, "SIE_ALLOW_UNAUTHENTICATED_ADMIN on 0.0.0.0", expected="exit 2", actual=f"exit {result.returncode}")
    assert result.returncode == 2
    assert "SIE_ALLOW_UNAUTHENTICATED_ADMIN=true" in result.stderr and "loopback" in result.stderr


async def test_remote_code_is_refused_even_with_the_admin_token(start_config, etcd: Etcd, reliability_report) -> None:
    config = start_config(SIE_ADMIN_TOKEN=ADMIN_TOKEN)
    with grpc.insecure_channel(config.address) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        wait_for_leader(admin)
        # A profile added to a model that exists already is checked too.
        admin.AddModel(config_pb2.AddModelRequest(config=model_config("test/plain", Path("/models/plain"))), metadata=bearer(ADMIN_TOKEN), timeout=30)
        before = await stored_models(etcd)
        trusting = model_config("test/plain", Path("/models/plain"))
        trusting["profiles"]["remote"] = remote_code_config("test/plain")["profiles"]["default"]
        for name, body in [("a new Hub model", remote_code_config("attacker/remote-code")), ("a new profile", trusting)]:
            with pytest.raises(grpc.RpcError) as refused:
                admin.AddModel(config_pb2.AddModelRequest(config=body), metadata=bearer(ADMIN_TOKEN), timeout=30)
            reliability_report.add(SECTION, f"AddModel trust_remote_code ({name}) with the admin token", expected="PERMISSION_DENIED REMOTE_CODE_DISABLED",
                                   actual=f"{refused.value.code().name} {error_info(refused.value).reason}")
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert error_info(refused.value).reason == "REMOTE_CODE_DISABLED"
            assert "SIE_ALLOW_REMOTE_CODE" in refused.value.details()
        assert await stored_models(etcd) == before == ["models/test/plain"]
        stored = admin.GetModelConfig(config_pb2.GetModelConfigRequest(model="test/plain"), metadata=bearer(ADMIN_TOKEN), timeout=10).config
        assert list(stored.profiles) == ["default"]


def test_a_worker_refuses_remote_code_from_etcd_unless_it_allows_it(tmp_path, etcd_server, etcd_prefix, tiny_models, start_config, reliability_report) -> None:
    # The operator allowed remote code on the config service, not on this worker.
    trusting = remote_code_config("test/trusting", tiny_models[MEAN])
    cluster = Cluster(
        tmp_path, etcd_server.endpoint, etcd_prefix, [model_config(MEAN, tiny_models[MEAN]), trusting],
        lambda: start_config(SIE_ADMIN_TOKEN=ADMIN_TOKEN, SIE_ALLOW_REMOTE_CODE="true"), admin_token=ADMIN_TOKEN,
    )
    try:
        worker = cluster.start_worker("cautious", SIE_PRELOAD_MODELS=MEAN)
        with worker.channel() as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            request = inference_pb2.EncodeRequest(model="test/trusting", items=[types_pb2.Item(text="x")])
            with pytest.raises(grpc.RpcError) as refused:
                call_until_loaded(lambda: stub.Encode(request, timeout=30))
            reliability_report.add(SECTION, "worker asked to load a trust_remote_code config from etcd", expected="FAILED_PRECONDITION REMOTE_CODE_DISABLED",
                                   actual=f"{refused.value.code().name} {error_info(refused.value).reason}")
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error_info(refused.value).reason == "REMOTE_CODE_DISABLED"
            assert "SIE_ALLOW_REMOTE_CODE" in refused.value.details()
            # The worker keeps serving.
            answer = stub.Encode(inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="still here")]), timeout=30)
            assert len(answer.results) == 1
        assert "loaded test/trusting" not in worker.log()
    finally:
        cluster.stop()


# -- tokens on workers and config reads (defect 13) ------------------------------------------------


@pytest.fixture
def guarded(cluster: Cluster) -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    """A worker and a gateway with inference tokens on, and a worker token on the Work stream between them."""
    tokens = {"SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": f"other,{INFERENCE_TOKEN}", "SIE_WORKER_TOKEN": WORKER_TOKEN}
    worker = cluster.start_worker("guarded", SIE_PRELOAD_MODELS=MEAN, **tokens)
    gateway = cluster.start_gateway(SIE_ALLOW_UNAUTHENTICATED_WORKERS="true", **tokens)  # the test's etcd is open
    yield worker, gateway


def work(stub: worker_pb2_grpc.WorkerStub, metadata: tuple[tuple[str, str], ...]) -> list[worker_pb2.WorkResponse]:
    request = worker_pb2.WorkRequest(request_id="w1", encode=inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")]))
    return list(stub.Work(iter([request]), metadata=metadata, timeout=30))


def bad_embeddings(stub: inference_pb2_grpc.InferenceStub, metadata: tuple[tuple[str, str], ...]) -> object:
    """A CreateEmbeddings body the handler would refuse (a number is no input)."""
    request = inference_pb2.CreateEmbeddingsRequest(model=MEAN, input=struct_pb2.Value(number_value=1))
    return stub.CreateEmbeddings(request, metadata=metadata, timeout=30)


def test_a_worker_checks_inference_and_work_tokens(guarded, reliability_report) -> None:
    worker, gateway = guarded
    with worker.channel() as channel:
        inference = inference_pb2_grpc.InferenceStub(channel)
        encode = inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")])
        worker_stub = worker_pb2_grpc.WorkerStub(channel)
        cases = [
            ("Encode, no token", lambda: inference.Encode(encode, timeout=30), "UNAUTHENTICATED", "MISSING_TOKEN"),
            ("Encode, wrong token", lambda: inference.Encode(encode, metadata=bearer(WRONG_TOKEN), timeout=30), "PERMISSION_DENIED", "INVALID_TOKEN"),
            ("Encode, the worker token", lambda: inference.Encode(encode, metadata=bearer(WORKER_TOKEN), timeout=30), "PERMISSION_DENIED", "INVALID_TOKEN"),
            ("ListModels, no token", lambda: inference.ListModels(inference_pb2.ListModelsRequest(), timeout=30), "UNAUTHENTICATED", "MISSING_TOKEN"),
            ("CreateEmbeddings with a bad body, no token", lambda: bad_embeddings(inference, ()), "UNAUTHENTICATED", "MISSING_TOKEN"),
            ("Work, no token", lambda: work(worker_stub, ()), "UNAUTHENTICATED", "MISSING_TOKEN"),
            ("Work, an inference token", lambda: work(worker_stub, bearer(INFERENCE_TOKEN)), "PERMISSION_DENIED", "INVALID_TOKEN"),
            ("Encode, an inference token", lambda: inference.Encode(encode, metadata=bearer(INFERENCE_TOKEN), timeout=30), "OK", ""),
            ("CreateEmbeddings with a bad body, an inference token", lambda: bad_embeddings(inference, bearer(INFERENCE_TOKEN)), "INVALID_ARGUMENT", "INVALID_INPUT"),
        ]
        for name, call, code, reason in cases:
            got_code, got_reason = failure(call)
            reliability_report.add(SECTION, f"worker with tokens on: {name}", expected=f"{code} {reason}".strip(), actual=f"{got_code.name} {got_reason}".strip())
            assert (got_code.name, got_reason) == (code, reason), name
        (answer,) = work(worker_stub, bearer(WORKER_TOKEN))
        assert answer.WhichOneof("outcome") == "encode" and len(answer.encode.results) == 1
    # The gateway presents the worker token on its Work stream, so callers with an inference token are served.
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: "guarded" in stub.GetModel(inference_pb2.GetModelRequest(model=MEAN), metadata=bearer(INFERENCE_TOKEN), timeout=10).model.loaded_on,
                   what="the worker registered")
        answer = stub.Encode(inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")]), metadata=bearer(INFERENCE_TOKEN), timeout=30)
        assert len(answer.results) == 1
    assert WORKER_TOKEN not in worker.log() and INFERENCE_TOKEN not in gateway.log()


def test_the_gateway_checks_the_token_before_it_reads_the_request(cluster: Cluster, reliability_report) -> None:
    gateway = cluster.start_gateway(SIE_AUTH_MODE="static", SIE_AUTH_TOKENS=INFERENCE_TOKEN)
    with gateway.channel() as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        raw = channel.unary_unary("/sie.v1.Inference/CreateEmbeddings", request_serializer=None, response_deserializer=None)
        cases = [
            ("CreateEmbeddings with a bad body, no token", lambda: bad_embeddings(stub, ()), "UNAUTHENTICATED MISSING_TOKEN"),
            ("CreateEmbeddings with bytes that are no request, no token", lambda: raw(b"\xff\xff\xff", timeout=30), "UNAUTHENTICATED MISSING_TOKEN"),
            ("CreateEmbeddings with a bad body, a token", lambda: bad_embeddings(stub, bearer(INFERENCE_TOKEN)), "INVALID_ARGUMENT INVALID_INPUT"),
        ]
        for name, call, expected in cases:
            code, reason = failure(call)
            reliability_report.add(SECTION, f"gateway with tokens on: {name}", expected=expected, actual=f"{code.name} {reason}")
            assert f"{code.name} {reason}" == expected, name


@pytest.mark.process
def test_a_worker_with_inference_tokens_but_an_open_work_stream_does_not_start(tmp_path, reliability_report) -> None:
    env = {**os.environ, "SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": INFERENCE_TOKEN, "SIE_HOST": "127.0.0.1"}
    result = subprocess.run(
        [sys.executable, "-m", "sie_worker", "serve", "--port", str(free_port()), "--metrics-port", "0"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    reliability_report.add(SECTION, "worker with SIE_AUTH_MODE=static and no SIE_WORKER_TOKEN", expected="exit 2", actual=f"exit {result.returncode}")
    assert result.returncode == 2
    assert "SIE_WORKER_TOKEN" in result.stderr


def test_config_reads_need_the_admin_token_when_one_is_set(start_config, tiny_models, reliability_report) -> None:
    config = start_config(SIE_ADMIN_TOKEN=ADMIN_TOKEN)
    with grpc.insecure_channel(config.address) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        wait_for_leader(admin)
        admin.AddModel(config_pb2.AddModelRequest(config=model_config(MEAN, tiny_models[MEAN])), metadata=bearer(ADMIN_TOKEN), timeout=30)
        reads = {
            "ListModelConfigs": lambda metadata: admin.ListModelConfigs(config_pb2.ListModelConfigsRequest(), metadata=metadata, timeout=10),
            "GetModelConfig": lambda metadata: admin.GetModelConfig(config_pb2.GetModelConfigRequest(model=MEAN), metadata=metadata, timeout=10),
            "ExportConfigs": lambda metadata: admin.ExportConfigs(config_pb2.ExportConfigsRequest(), metadata=metadata, timeout=10),
        }
        for name, read in reads.items():
            for presented, metadata, expected in [
                ("no token", (), (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")),
                ("wrong token", bearer(WRONG_TOKEN), (grpc.StatusCode.PERMISSION_DENIED, "INVALID_TOKEN")),
                ("the admin token", bearer(ADMIN_TOKEN), (grpc.StatusCode.OK, "")),
            ]:
                got = failure(lambda: read(metadata))
                reliability_report.add(SECTION, f"config {name}, {presented}", expected=" ".join([expected[0].name, expected[1]]).strip(),
                                       actual=" ".join([got[0].name, got[1]]).strip())
                assert got == expected, f"{name} with {presented}"
        # The epoch and the bundles stay open: gateways' and operators' health checks read them.
        assert admin.GetEpoch(config_pb2.GetEpochRequest(), timeout=10).epoch > 0
        assert admin.ListBundles(config_pb2.ListBundlesRequest(), timeout=10).bundles


# -- `sie up` (defects 3 and 14a) -----------------------------------------------------------------


class RunningStack:
    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.ports = {name: free_port() for name in ("etcd", "config", "worker", "gateway", "http", "admin")}
        self.state = tmp / "state"
        command = [
            sys.executable, "-m", "sie_stack", "up", "--state-dir", str(self.state),
            "--etcd-port", str(self.ports["etcd"]), "--config-port", str(self.ports["config"]), "--worker-port", str(self.ports["worker"]),
            "--gateway-port", str(self.ports["gateway"]), "--http-port", str(self.ports["http"]), "--envoy-admin-port", str(self.ports["admin"]),
        ]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **env}
        )
        self.output: list[str] = []
        for line in iter(self.process.stdout.readline, ""):
            self.output.append(line)
            if "Ctrl-C stops everything." in line:
                return
        raise AssertionError("sie up did not come up:\n" + "".join(self.output))

    @property
    def banner(self) -> str:
        return "".join(self.output)

    def http(self, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
        headers = {"content-type": "application/json", **({"authorization": f"Bearer {token}"} if token else {})}
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{self.ports['http']}{path}", data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                return reply.status, json.load(reply)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")

    def stop(self) -> None:
        stop_stack(self.process)


@pytest.fixture
def start_stack(tmp_path) -> Iterator[Callable[[dict[str, str]], RunningStack]]:
    started: list[RunningStack] = []

    def start(env: dict[str, str]) -> RunningStack:
        started.append(RunningStack(tmp_path, env))
        return started[-1]

    yield start
    for stack in started:
        stack.stop()


ENCODE_PATH = f"/v1/encode/{DEMO_MODEL}"
ENCODE_BODY = {"items": [{"text": "hello"}]}
# The HTTP body of POST /v1/configs/models is the config itself.
ADD_MODEL = {"id": "my-org/my-encoder", "hf_id": "my-org/my-encoder", "profiles": {"default": {"adapter": "sentence_transformer"}}}


@pytest.mark.process
def test_default_sie_up_makes_an_admin_token_and_refuses_writes_without_it(start_stack, reliability_report) -> None:
    env = {key: "" for key in ("SIE_ADMIN_TOKEN", "SIE_AUTH_MODE", "SIE_AUTH_TOKENS", "SIE_ALLOW_UNAUTHENTICATED_ADMIN")}
    stack = start_stack({**env, "SIE_AUTH_MODE": "none"})
    token_file = stack.state / "admin-token"
    token = token_file.read_text().strip()
    assert len(token) >= 32 and token in stack.banner and oct(token_file.stat().st_mode & 0o777) == "0o600"
    cases = [
        ("AddModel, no token", ADD_MODEL, None, 401, "MISSING_TOKEN"),
        ("AddModel trust_remote_code, the admin token", remote_code_config("attacker/remote-code"), token, 403, "REMOTE_CODE_DISABLED"),
        ("AddModel, the admin token", ADD_MODEL, token, 200, ""),
    ]
    for name, body, presented, status, reason in cases:
        got, answer = stack.http("/v1/configs/models", body, presented)
        got_reason = next((d["reason"] for d in answer.get("details", ()) if d.get("@type", "").endswith("google.rpc.ErrorInfo")), "")
        reliability_report.add(SECTION, f"default sie up, HTTP {name}", expected=f"{status} {reason}".strip(), actual=f"{got} {got_reason}".strip())
        assert (got, got_reason) == (status, reason), f"{name}: {answer}"
    assert stack.http(ENCODE_PATH, ENCODE_BODY)[0] == 200  # inference stays open without SIE_AUTH_MODE
    # The README's grpcurl line: the token from the state directory.
    grpcurl = Path(sys.executable).parent / "grpcurl"
    listed = subprocess.run(
        [str(grpcurl), "-plaintext", "-H", f"authorization: Bearer {token}", f"127.0.0.1:{stack.ports['config']}", "sie.v1.ConfigService/ListModelConfigs"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert {c["id"] for c in json.loads(listed)["configs"]} == {DEMO_MODEL, "my-org/my-encoder"}


@pytest.mark.process
def test_sie_up_with_both_tokens_starts_and_enforces_them(start_stack, reliability_report) -> None:
    stack = start_stack({"SIE_ADMIN_TOKEN": ADMIN_TOKEN, "SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": INFERENCE_TOKEN})
    assert not (stack.state / "admin-token").exists()  # the operator's token is not written anywhere
    assert ADMIN_TOKEN not in stack.banner and INFERENCE_TOKEN not in stack.banner
    cases = [
        ("encode, no token", ENCODE_PATH, ENCODE_BODY, None, 401),
        ("encode, wrong token", ENCODE_PATH, ENCODE_BODY, WRONG_TOKEN, 403),
        ("encode, the admin token", ENCODE_PATH, ENCODE_BODY, ADMIN_TOKEN, 403),
        ("encode, the inference token", ENCODE_PATH, ENCODE_BODY, INFERENCE_TOKEN, 200),
        ("models, no token", "/v1/models", None, None, 401),
        ("AddModel, no token", "/v1/configs/models", ADD_MODEL, None, 401),
        ("AddModel, the inference token", "/v1/configs/models", ADD_MODEL, INFERENCE_TOKEN, 403),
        ("AddModel, the admin token", "/v1/configs/models", ADD_MODEL, ADMIN_TOKEN, 200),
    ]
    for name, path, body, token, status in cases:
        got, answer = stack.http(path, body, token)
        reliability_report.add(SECTION, f"sie up with both tokens, HTTP {name}", expected=status, actual=got)
        assert got == status, f"{name}: {answer}"
    # The worker behind it checks the inference token and keeps its Work stream to the gateway.
    with grpc.insecure_channel(f"127.0.0.1:{stack.ports['worker']}") as channel:
        request = inference_pb2.EncodeRequest(model=DEMO_MODEL, items=[types_pb2.Item(text="x")])
        assert failure(lambda: inference_pb2_grpc.InferenceStub(channel).Encode(request, timeout=30)) == (grpc.StatusCode.UNAUTHENTICATED, "MISSING_TOKEN")
        assert failure(lambda: work(worker_pb2_grpc.WorkerStub(channel), bearer(INFERENCE_TOKEN))) == (grpc.StatusCode.PERMISSION_DENIED, "INVALID_TOKEN")
