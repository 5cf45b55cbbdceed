"""Security against real processes: TLS on every gRPC server (a plaintext client refused, a TLS client
served), mutual TLS between the gateway and its workers, bearer tokens on every protected RPC of the
gateway and the config service, and no token in any log line."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from grpc_helpers import bearer, call_until_loaded, error_info, stacked
from local_cluster import model_config, wait_until
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from sie_stack.up import wait_for_leader
from tls_certs import CertFiles, Pki, make_pki
from worker_process import WorkerProcess

MEAN = "test/tiny-mean"
# Distinctive, so a leak into any log line is found by a plain substring search.
INFERENCE_TOKEN = "inference-tok-7f3a9c"
ADMIN_TOKEN = "admin-tok-5e1d44"
WRONG_TOKEN = "wrong-tok-0b2c88"


def credentials(pki: Pki, client: CertFiles | None = None) -> grpc.ChannelCredentials:
    """A TLS client trusting the test CA, presenting `client` when given."""
    chain, key = client.pair() if client is not None else (None, None)
    return grpc.ssl_channel_credentials(pki.ca.cert.read_bytes(), private_key=key, certificate_chain=chain)


def tls_env(pki: Pki, *, mutual: bool = False) -> dict[str, str]:
    env = {"SIE_TLS_CERT_FILE": str(pki.server.cert), "SIE_TLS_KEY_FILE": str(pki.server.key)}
    if mutual:
        env["SIE_TLS_CLIENT_CA_FILE"] = str(pki.ca.cert)
    return env


@dataclass
class SecureStack:
    pki: Pki
    config: WorkerProcess
    worker: WorkerProcess
    gateway: WorkerProcess
    start_gateway: Callable[..., WorkerProcess]

    def processes(self) -> list[WorkerProcess]:
        return [self.config, self.worker, self.gateway]


@pytest.fixture(scope="module")
def secure(tmp_path_factory, etcd_server, tiny_models) -> Iterator[SecureStack]:
    """Config service (TLS, admin token), a cluster worker (mutual TLS: clients need a certificate)
    and a gateway (TLS, static tokens, mutual TLS to the worker); DEBUG logs, to look for tokens in."""
    tmp = tmp_path_factory.mktemp("secure")
    pki = make_pki(tmp / "pki")
    (tmp / "models").mkdir()
    common = {"SIE_ETCD_ENDPOINTS": etcd_server.endpoint, "SIE_ETCD_PREFIX": f"/sie-secure-{uuid.uuid4().hex[:8]}/", "SIE_LOG_LEVEL": "DEBUG"}
    started: list[WorkerProcess] = []

    def start(module: str, env: dict[str, str], client: grpc.ChannelCredentials, timeout_s: float = 60) -> WorkerProcess:
        process = WorkerProcess({**common, **env}, tmp / f"{module}-{len(started)}.log", module=module, credentials=client)
        started.append(process)
        process.wait_serving(timeout_s=timeout_s)
        return process

    def start_gateway(**env: str) -> WorkerProcess:
        gateway_env = {**tls_env(pki), "SIE_AUTH_MODE": "static", "SIE_AUTH_TOKENS": f"other-token,{INFERENCE_TOKEN}", **env}
        return start("sie_gateway", gateway_env, credentials(pki))

    try:
        config = start("sie_config", {**tls_env(pki), "SIE_ADMIN_TOKEN": ADMIN_TOKEN, "SIE_CONFIG_LEADER_TTL_S": "3"}, credentials(pki))
        with grpc.secure_channel(config.address, credentials(pki)) as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            wait_for_leader(admin)
            admin.AddModel(config_pb2.AddModelRequest(config=model_config(MEAN, tiny_models[MEAN])), metadata=bearer(ADMIN_TOKEN))
        worker_env = {
            **tls_env(pki, mutual=True), "SIE_WORKER_ID": "tls-worker", "SIE_MODELS_DIR": str(tmp / "models"), "SIE_PRELOAD_MODELS": MEAN,
            "SIE_HEALTH_PUBLISH_INTERVAL_MS": "200", "SIE_WORKER_LEASE_TTL_S": "3",
        }
        worker = start("sie_worker", worker_env, credentials(pki, pki.client), timeout_s=180)
        gateway = start_gateway(
            SIE_WORKER_TLS_CA_FILE=str(pki.ca.cert), SIE_WORKER_TLS_CERT_FILE=str(pki.client.cert), SIE_WORKER_TLS_KEY_FILE=str(pki.client.key)
        )
        with grpc.secure_channel(gateway.address, credentials(pki)) as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)
            wait_until(
                lambda: "tls-worker" in stub.GetModel(inference_pb2.GetModelRequest(model=MEAN), metadata=bearer(INFERENCE_TOKEN), timeout=10).model.loaded_on,
                timeout_s=60, what="the TLS worker registered",
            )
        yield SecureStack(pki, config, worker, gateway, start_gateway)
    finally:
        for process in reversed(started):
            process.stop()


def health(address: str, channel_credentials: grpc.ChannelCredentials | None) -> grpc.StatusCode:
    """OK when a health check over this transport answers SERVING, else the call's status."""
    channel = grpc.secure_channel(address, channel_credentials) if channel_credentials else grpc.insecure_channel(address)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK if reply.status == health_pb2.HealthCheckResponse.SERVING else grpc.StatusCode.UNAVAILABLE


def test_tls_servers_refuse_plaintext_and_serve_tls_clients(secure, reliability_report) -> None:
    pki = secure.pki
    cases = [
        ("config service", secure.config, None, grpc.StatusCode.UNAVAILABLE),
        ("config service", secure.config, credentials(pki), grpc.StatusCode.OK),
        ("gateway", secure.gateway, None, grpc.StatusCode.UNAVAILABLE),
        ("gateway", secure.gateway, credentials(pki), grpc.StatusCode.OK),
        ("worker (mutual TLS)", secure.worker, None, grpc.StatusCode.UNAVAILABLE),
        ("worker (mutual TLS)", secure.worker, credentials(pki), grpc.StatusCode.UNAVAILABLE),
        ("worker (mutual TLS)", secure.worker, credentials(pki, pki.stranger), grpc.StatusCode.UNAVAILABLE),
        ("worker (mutual TLS)", secure.worker, credentials(pki, pki.client), grpc.StatusCode.OK),
    ]
    clients = ["plaintext client", "TLS client", "plaintext client", "TLS client", "plaintext client", "TLS client without a certificate",
               "client certificate from another CA", "client certificate from the CA"]
    for (server, process, client_credentials, expected), client in zip(cases, clients):
        got = health(process.address, client_credentials)
        reliability_report.add("security", f"{server}: {client}", expected=expected.name, actual=got.name)
        assert got == expected, f"{server}, {client}: {got.name}"


def test_gateway_serves_through_mutual_tls_to_the_worker(secure, reliability_report) -> None:
    from sie_client import SIEClient

    pki = secure.pki
    texts = ["over tls", "and mutual tls to the worker"]
    with SIEClient(secure.gateway.address, api_key=INFERENCE_TOKEN, root_certificates=pki.ca.cert.read_bytes()) as client:
        through_gateway = np.stack([result["dense"] for result in client.encode(MEAN, texts)])
    with grpc.secure_channel(secure.worker.address, credentials(pki, pki.client)) as channel:
        direct = inference_pb2_grpc.InferenceStub(channel).Encode(
            inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text=text) for text in texts]), timeout=60
        )

    np.testing.assert_array_equal(through_gateway, stacked(result.dense for result in direct.results))
    reliability_report.add("security", "gateway -> worker over mutual TLS", expected="OK", actual="OK")

    # A gateway that trusts the workers' CA but has no client certificate is refused by them.
    uncertified = secure.start_gateway(SIE_WORKER_TLS_CA_FILE=str(pki.ca.cert))
    with grpc.secure_channel(uncertified.address, credentials(pki)) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: bool(stub.ListModels(inference_pb2.ListModelsRequest(), metadata=bearer(INFERENCE_TOKEN), timeout=10).models), what="mirror synced")
        with pytest.raises(grpc.RpcError) as refused:
            stub.Encode(inference_pb2.EncodeRequest(model=MEAN, items=[types_pb2.Item(text="x")]), metadata=bearer(INFERENCE_TOKEN), timeout=30)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert error_info(refused.value).reason == "WORKERS_LOST"
    reliability_report.add("security", "gateway without a client certificate -> worker", expected="UNAVAILABLE", actual=refused.value.code().name)
    uncertified.stop()


def inference_calls(stub: inference_pb2_grpc.InferenceStub) -> dict[str, Callable[..., object]]:
    """Every RPC of sie.v1.Inference, each a call taking `metadata=`."""
    item = [types_pb2.Item(text="x")]

    def stream(metadata):
        requests = iter([inference_pb2.EncodeStreamRequest(request=inference_pb2.EncodeRequest(model=MEAN, items=item, request_id="s"))])
        return list(stub.EncodeStream(requests, metadata=metadata, timeout=30))

    return {
        "Encode": lambda metadata: stub.Encode(inference_pb2.EncodeRequest(model=MEAN, items=item), metadata=metadata, timeout=30),
        "Score": lambda metadata: stub.Score(inference_pb2.ScoreRequest(model=MEAN, query=item[0], items=item), metadata=metadata, timeout=30),
        "Extract": lambda metadata: stub.Extract(inference_pb2.ExtractRequest(model=MEAN, items=item), metadata=metadata, timeout=30),
        "EncodeStream": stream,
        "CreateEmbeddings": lambda metadata: stub.CreateEmbeddings(inference_pb2.CreateEmbeddingsRequest(model=MEAN, input=struct_pb2.Value(string_value="x")), metadata=metadata, timeout=30),
        "ListModels": lambda metadata: stub.ListModels(inference_pb2.ListModelsRequest(), metadata=metadata, timeout=30),
        "GetModel": lambda metadata: stub.GetModel(inference_pb2.GetModelRequest(model=MEAN), metadata=metadata, timeout=30),
        "CreatePool": lambda metadata: stub.CreatePool(inference_pb2.CreatePoolRequest(name="p", gpus={"default": 1}), metadata=metadata, timeout=30),
        "GetPool": lambda metadata: stub.GetPool(inference_pb2.GetPoolRequest(name="p"), metadata=metadata, timeout=30),
        "ListPools": lambda metadata: stub.ListPools(inference_pb2.ListPoolsRequest(), metadata=metadata, timeout=30),
        "RenewPool": lambda metadata: stub.RenewPool(inference_pb2.RenewPoolRequest(name="p"), metadata=metadata, timeout=30),
        "DeletePool": lambda metadata: stub.DeletePool(inference_pb2.DeletePoolRequest(name="p"), metadata=metadata, timeout=30),
    }


def config_calls(stub: config_pb2_grpc.ConfigServiceStub) -> dict[str, Callable[..., object]]:
    """The config service's protected RPCs: writes and export."""
    return {
        "AddModel": lambda metadata: stub.AddModel(
            config_pb2.AddModelRequest(config={"id": "x/never-added", "hf_id": "x/y", "profiles": {"default": {"adapter": "sentence_transformer"}}}),
            metadata=metadata, timeout=30,
        ),
        "ExportConfigs": lambda metadata: stub.ExportConfigs(config_pb2.ExportConfigsRequest(), metadata=metadata, timeout=30),
    }


def refusal(call: Callable[..., object], metadata) -> grpc.StatusCode:
    try:
        call(metadata)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def test_every_protected_rpc_refuses_missing_and_wrong_tokens(secure, reliability_report) -> None:
    pki = secure.pki
    with grpc.secure_channel(secure.gateway.address, credentials(pki)) as gateway, grpc.secure_channel(secure.config.address, credentials(pki)) as config:
        protected = [("gateway", name, call) for name, call in inference_calls(inference_pb2_grpc.InferenceStub(gateway)).items()]
        protected += [("config service", name, call) for name, call in config_calls(config_pb2_grpc.ConfigServiceStub(config)).items()]
        for server, name, call in protected:
            for presented, metadata, expected in [
                ("no token", (), grpc.StatusCode.UNAUTHENTICATED),
                ("wrong token", bearer(WRONG_TOKEN), grpc.StatusCode.PERMISSION_DENIED),
                ("not a bearer header", (("authorization", f"Basic {INFERENCE_TOKEN}"),), grpc.StatusCode.UNAUTHENTICATED),
            ]:
                got = refusal(call, metadata)
                reliability_report.add("security", f"{server} {name} over gRPC, {presented}", expected=expected.name, actual=got.name)
                assert got == expected, f"{server} {name} with {presented}: {got.name}"
        # The right tokens open them.
        assert refusal(inference_calls(inference_pb2_grpc.InferenceStub(gateway))["Encode"], bearer(INFERENCE_TOKEN)) == grpc.StatusCode.OK
        assert refusal(config_calls(config_pb2_grpc.ConfigServiceStub(config))["ExportConfigs"], bearer(ADMIN_TOKEN)) == grpc.StatusCode.OK


def test_no_token_reaches_a_log_line(secure, reliability_report) -> None:
    # Every service has seen good and bad tokens by now (tests above), at DEBUG; once more to be sure.
    pki = secure.pki
    with grpc.secure_channel(secure.gateway.address, credentials(pki)) as gateway:
        calls = inference_calls(inference_pb2_grpc.InferenceStub(gateway))
        for token in (INFERENCE_TOKEN, WRONG_TOKEN, ADMIN_TOKEN):
            refusal(calls["Encode"], bearer(token))
            refusal(calls["ListModels"], bearer(token))
    logs = {Path(process.log_path).name: process.log() for process in secure.processes()}
    assert all(logs.values())
    for name, text in logs.items():
        leaked = [token for token in (INFERENCE_TOKEN, ADMIN_TOKEN, WRONG_TOKEN) if token in text]
        reliability_report.add("security", f"tokens in the {name} log", expected="none", actual=",".join(leaked) or "none", lines=text.count("\n"))
        assert not leaked, f"{name} logged {leaked}"


def test_a_config_added_at_run_time_cannot_point_a_worker_outside_its_weight_roots(secure, reliability_report) -> None:
    pki = secure.pki
    with grpc.secure_channel(secure.config.address, credentials(pki)) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        with pytest.raises(grpc.RpcError) as traversal:
            admin.AddModel(config_pb2.AddModelRequest(config=model_config("test/traversal", Path("../../etc"))), metadata=bearer(ADMIN_TOKEN))
        reliability_report.add("security", "AddModel with path '../../etc'", expected="INVALID_ARGUMENT", actual=traversal.value.code().name)
        assert traversal.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "contains '..'" in traversal.value.details()
        # An absolute path is valid to the config service; the worker refuses it against its own roots.
        admin.AddModel(config_pb2.AddModelRequest(config=model_config("test/etc", Path("/etc"))), metadata=bearer(ADMIN_TOKEN))
    with grpc.secure_channel(secure.gateway.address, credentials(pki)) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.EncodeRequest(model="test/etc", items=[types_pb2.Item(text="x")])
        wait_until(lambda: refusal(lambda metadata: stub.Encode(request, metadata=metadata, timeout=30), bearer(INFERENCE_TOKEN)) != grpc.StatusCode.NOT_FOUND, what="model mirrored")
        with pytest.raises(grpc.RpcError) as outside:
            call_until_loaded(lambda: stub.Encode(request, metadata=bearer(INFERENCE_TOKEN), timeout=30))
    reliability_report.add("security", "worker asked to load weights from /etc", expected="FAILED_PRECONDITION", actual=outside.value.code().name)
    assert outside.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error_info(outside.value).reason == "WEIGHTS_OUTSIDE_ROOTS"
    assert "outside the allowed weight roots" in outside.value.details()


@pytest.mark.process
def test_half_a_tls_setup_stops_the_service_with_a_message(tmp_path, reliability_report) -> None:
    pki = make_pki(tmp_path / "pki")
    config = WorkerProcess({"SIE_TLS_CERT_FILE": str(pki.server.cert), "SIE_ETCD_ENDPOINTS": "127.0.0.1:1"}, tmp_path / "config.log", module="sie_config")
    with pytest.raises(RuntimeError) as stopped:
        config.wait_serving(timeout_s=60)
    reliability_report.add("security", "SIE_TLS_CERT_FILE without SIE_TLS_KEY_FILE", expected="exit 1", actual=f"exit {config.process.returncode}")
    assert config.process.returncode == 1
    assert "SIE_TLS_CERT_FILE and SIE_TLS_KEY_FILE go together" in str(stopped.value)
