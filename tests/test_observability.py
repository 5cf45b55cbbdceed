"""Observability against real processes: metrics that move, readiness, JSON logs, and one trace
from the client through gateway and worker received at a loopback OTLP receiver."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from conftest import MINILM
from local_cluster import wait_until
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from worker_process import WorkerProcess

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN_ID = "00f067aa0ba902b7"


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(process: WorkerProcess) -> str:
    status, body = http_get(f"{process.metrics_url}/metrics")
    assert status == 200
    return body


def sample(metrics: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text; 0 when the series does not exist yet."""
    for line in metrics.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if found == labels:
            return float(match.group(3))
    return 0.0


def encode_request(model: str, texts: list[str], request_id: str = "") -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text=text) for text in texts], request_id=request_id)


# -- metrics ---------------------------------------------------------------------


def test_worker_metrics_move_under_load(worker: WorkerProcess) -> None:
    model = "test/tiny-mean"
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        stats_before = stub.GetModel(inference_pb2.GetModelRequest(model=model), timeout=10).model.stats
        before = scrape(worker)
        texts = [f"item {index} of a small load" for index in range(3)]
        with futures.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: stub.Encode(encode_request(model, texts), timeout=60), range(8)))
        with pytest.raises(grpc.RpcError) as refused:
            stub.Encode(encode_request(model, []), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Encode(encode_request("made-up/model-name", ["x"]), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        stats_after = stub.GetModel(inference_pb2.GetModelRequest(model=model), timeout=10).model.stats
    after = scrape(worker)
    assert len(answers) == 8

    def grew(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert grew("sie_worker_requests_total", model=model, operation="encode", status="OK") == 8
    assert grew("sie_worker_requests_total", model=model, operation="encode", status="INVALID_ARGUMENT") == 1
    assert grew("sie_worker_request_duration_seconds_count", model=model, operation="encode") == 9
    # A model nobody serves is counted under one label, so made-up names add no series.
    assert grew("sie_worker_requests_total", model="(unknown)", operation="encode", status="NOT_FOUND") == 1
    assert "made-up/model-name" not in after
    assert grew("sie_worker_queue_duration_seconds_count", model=model, operation="encode") == 8
    # The batch histograms count forward passes: as many as the model's own counter saw, holding all 24 items.
    passes = stats_after.forward_passes - stats_before.forward_passes
    assert 1 <= passes <= 8
    assert grew("sie_worker_batch_items_count", model=model, profile="default") == passes
    assert grew("sie_worker_batch_items_sum", model=model, profile="default") == 24
    assert grew("sie_worker_inference_duration_seconds_count", model=model) == passes
    assert grew("sie_worker_batch_tokens_sum", model=model, profile="default") > 24  # every item is several tokens
    assert sample(after, "sie_worker_queue_depth") == 0
    assert sample(after, "sie_worker_requests_in_flight") == 0
    assert sample(after, "sie_worker_model_loaded", model=model) == 1
    assert sample(after, "sie_worker_model_memory_bytes") > 0


def test_metrics_port_serves_health_and_names_its_paths(worker: WorkerProcess) -> None:
    assert http_get(f"{worker.metrics_url}/healthz") == (200, "ok\n")
    assert http_get(f"{worker.metrics_url}/readyz") == (200, "ready\n")
    status, body = http_get(f"{worker.metrics_url}/nothing-here")
    assert status == 404 and "/metrics" in body


@pytest.mark.process
def test_a_taken_metrics_port_or_an_unknown_exporter_stops_the_worker_with_a_message(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _serve_worker({"SIE_HOST": "127.0.0.1", "SIE_PORT": "0", "SIE_MODELS_DIR": str(tmp_path), "SIE_WORKER_METRICS_PORT": str(port)})
    assert result.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}: Address already in use" in result.stderr
    result = _serve_worker({"SIE_TRACING_ENABLED": "true", "OTEL_TRACES_EXPORTER": "zipkin"})
    assert result.returncode == 2
    assert "OTEL_TRACES_EXPORTER='zipkin': expected otlp, console or none" in result.stderr


def _serve_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sie_worker", "serve"], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


# -- readiness -------------------------------------------------------------------


@pytest.mark.process
def test_worker_is_not_ready_until_its_preload_finishes(tmp_path: Path) -> None:
    """The preload asks an S3 cluster cache that accepts connections and never answers; readiness
    waits for it, liveness does not. Closing that server fails the lookup, the model loads from its
    bundled weights, and the worker becomes ready."""
    stalled = socket.socket()
    stalled.bind(("127.0.0.1", 0))
    stalled.listen(16)
    empty = tmp_path / "empty"
    empty.mkdir()
    worker = WorkerProcess(
        {
            "SIE_MODELS_DIR": str(empty),
            "SIE_PRELOAD_MODELS": MINILM,
            "SIE_LOCAL_CACHE": str(tmp_path / "local-cache"),
            "SIE_CLUSTER_CACHE": "s3://stalled/weights",
            "SIE_S3_ENDPOINT_URL": f"http://127.0.0.1:{stalled.getsockname()[1]}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_MAX_ATTEMPTS": "1",
        },
        tmp_path / "worker.log",
    )
    try:
        wait_until(lambda: _status(f"{worker.metrics_url}/healthz") == 200, timeout_s=120, what="/healthz")
        with grpc.insecure_channel(worker.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            wait_until(lambda: "cluster cache" in worker.log() or _health(health) is not None, timeout_s=60, what="gRPC health")
            assert _health(health) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert http_get(f"{worker.metrics_url}/readyz") == (503, "not ready\n")
            stalled.close()
            worker.wait_serving(timeout_s=120)
            assert _health(health) == health_pb2.HealthCheckResponse.SERVING
        assert http_get(f"{worker.metrics_url}/readyz") == (200, "ready\n")
    finally:
        stalled.close()
        worker.stop()


def _status(url: str) -> int | None:
    try:
        return http_get(url)[0]
    except OSError:
        return None


def _health(stub: health_pb2_grpc.HealthStub) -> int | None:
    try:
        return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
    except grpc.RpcError:
        return None


# -- one traced request through gateway and worker ---------------------------------


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """A loopback OTLP/gRPC trace collector: keeps every span it is sent, with its service name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self._lock = threading.Lock()

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name")
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend((service, span) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def of_trace(self, trace_id: str) -> list[tuple[str, object]]:
        with self._lock:
            return [(service, span) for service, span in self.spans if span.trace_id.hex() == trace_id]


@pytest.fixture
def otlp_receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    receiver = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, f"http://127.0.0.1:{port}"
    server.stop(0)


def test_one_trace_through_gateway_and_worker_with_json_logs_and_demand(cluster, otlp_receiver) -> None:
    receiver, endpoint = otlp_receiver
    observed = {
        "SIE_TRACING_ENABLED": "true",
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "SIE_LOG_JSON": "true",
        "SIE_LOG_LEVEL": "DEBUG",
    }
    worker = cluster.start_worker("traced-worker", SIE_PRELOAD_MODELS="test/tiny-mean", **observed)
    gateway = cluster.start_gateway(SIE_GATEWAY_CONFIGURED_GPUS="l4", **observed)
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        wait_until(lambda: "traced-worker" in _workers(stub), what="the worker in the gateway's mirror")
        traceparent = f"00-{TRACE_ID}-{CLIENT_SPAN_ID}-01"
        response = stub.Encode(encode_request("test/tiny-mean", ["trace me"], request_id="traced-1"), metadata=(("traceparent", traceparent),), timeout=60)
        assert len(response.results) == 1 and response.results[0].dense.shape
        with pytest.raises(grpc.RpcError) as provisioning:
            stub.Encode(encode_request("test/tiny-mean", ["any l4?"]), metadata=(("x-sie-machine-profile", "l4"),), timeout=30)
        assert provisioning.value.code() == grpc.StatusCode.UNAVAILABLE

    # Spans: client -> gateway server span -> gateway client span (Work) -> worker server span -> stages.
    wanted = {"/sie.v1.Inference/Encode", "sie.v1.Worker/Work encode", "queue", "tokenization", "inference", "postprocessing"}
    wait_until(lambda: wanted <= {span.name for _, span in receiver.of_trace(TRACE_ID)} and len(receiver.of_trace(TRACE_ID)) >= 7, what="the trace's spans")
    spans = receiver.of_trace(TRACE_ID)
    by_kind = {(service, span.name, span.kind): span for service, span in spans}
    server_kind, client_kind = 2, 3  # SPAN_KIND_SERVER, SPAN_KIND_CLIENT
    gateway_server = by_kind[("sie-gateway", "/sie.v1.Inference/Encode", server_kind)]
    gateway_client = by_kind[("sie-gateway", "sie.v1.Worker/Work encode", client_kind)]
    worker_server = by_kind[("sie-worker", "sie.v1.Worker/Work encode", server_kind)]
    assert gateway_server.parent_span_id.hex() == CLIENT_SPAN_ID
    assert gateway_client.parent_span_id == gateway_server.span_id
    assert worker_server.parent_span_id == gateway_client.span_id
    for stage in ("queue", "tokenization", "inference", "postprocessing"):
        (stage_span,) = [span for service, span in spans if service == "sie-worker" and span.name == stage]
        assert stage_span.parent_span_id == worker_server.span_id, stage
        assert worker_server.start_time_unix_nano <= stage_span.start_time_unix_nano <= stage_span.end_time_unix_nano <= worker_server.end_time_unix_nano
    # Nothing of etcd, health or the long-lived Work stream is traced.
    assert not [span.name for _, span in receiver.spans if "etcd" in span.name or "Health" in span.name or span.name == "/sie.v1.Worker/Work"]

    # JSON logs: every line of both services parses; the request's own lines carry its request_id and trace id.
    for process in (worker, gateway):
        lines = [json.loads(line) for line in process.log().splitlines() if line.strip()]
        assert lines and all({"timestamp", "level", "logger", "message"} <= line.keys() for line in lines)
        (answered,) = [line for line in lines if line.get("request_id") == "traced-1" and line["logger"].endswith(".requests")]
        assert answered["trace_id"] == TRACE_ID
        assert answered["model"] == "test/tiny-mean"
        assert answered["latency_ms"] > 0

    # Metrics: the gateway counted both requests; demand names the profile that has no worker.
    metrics = scrape(gateway)
    assert sample(metrics, "sie_gateway_requests_total", model="test/tiny-mean", operation="encode", status="OK") == 1
    assert sample(metrics, "sie_gateway_requests_total", model="test/tiny-mean", operation="encode", status="UNAVAILABLE") == 1
    assert sample(metrics, "sie_gateway_demand", machine_profile="l4", pool="") == 1
    assert sample(metrics, "sie_gateway_demand", machine_profile="default", pool="") == 0  # its request is answered
    assert sample(metrics, "sie_gateway_workers", machine_profile="default", pool="") == 1
    assert sample(metrics, "sie_gateway_requests_in_flight") == 0
    assert sample(scrape(worker), "sie_worker_requests_total", model="test/tiny-mean", operation="encode", status="OK") == 1
    # Every service of the cluster is ready on HTTP as on gRPC; the one config replica leads.
    for process in (cluster.config, worker, gateway):
        assert http_get(f"{process.metrics_url}/readyz") == (200, "ready\n")
    config_metrics = scrape(cluster.config)
    assert sample(config_metrics, "sie_config_leader") == 1
    assert sample(config_metrics, "sie_config_requests_total", model="", operation="AddModel", status="OK") == 2  # the cluster's two models


def _workers(stub: inference_pb2_grpc.InferenceStub) -> set[str]:
    models = stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10).models
    return {worker for model in models for rollout in model.rollouts for worker in (*rollout.current_workers, *rollout.lagging_workers)}
