"""Metric labels come only from closed sets (issue 32, defect 2): whatever callers send, /metrics of the gateway,
the worker and the config service holds no label value that is not a configured model, a profile of one, an
operation or a status code (or "(unknown)"), and stays small.

Hostile traffic against a real cluster (config service, worker, gateway on a real etcd): model names of 300 KB,
hundreds of random names with and without items, bad options, unknown profiles, machine profiles and pools, config
writes and reads for made-up models. Before the fix, every refusal but MODEL_NOT_FOUND kept the caller's model name
as a label: 50 such requests grew the gateway's /metrics to 557 MB."""

from __future__ import annotations

import ast
import random
import string
import urllib.request
from pathlib import Path

import grpc
from google.protobuf import struct_pb2
from prometheus_client.parser import text_string_to_metric_families

from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, types_pb2
from worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = [ROOT / "services", ROOT / "lib", ROOT / "deploy/local"]
# The one module that builds labelled metrics (each label through a closed set).
METRIC_LABELS = ROOT / "lib/sie_common/runtime/metric_labels.py"
PROMETHEUS_METRICS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
# /metrics of one service after the hostile traffic: the series of a few models, and prometheus_client's own.
MAX_METRICS_BYTES = 200_000
UNKNOWN = "(unknown)"
STATUS_NAMES = {code.name for code in grpc.StatusCode}
CONFIG_RPCS = set(config_pb2.DESCRIPTOR.services_by_name["ConfigService"].methods_by_name)


def _labels_given(call: ast.Call, name: str) -> bool:
    keywords = {keyword.arg for keyword in call.keywords}
    if name.endswith("MetricFamily"):
        return "labels" in keywords or len(call.args) >= 4
    return "labelnames" in keywords or len(call.args) >= 3


def test_no_module_but_metric_labels_builds_a_labelled_metric() -> None:
    """By construction: a labelled metric anywhere else could take a caller's string as a label value."""
    offenders = []
    for folder in FIRST_PARTY:
        for path in sorted(folder.rglob("*.py")):
            if path == METRIC_LABELS or ".venv" in path.parts:
                continue
            tree = ast.parse(path.read_text(), str(path))
            prometheus = {
                alias.asname or alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client")
                for alias in node.names
                if alias.name in PROMETHEUS_METRICS or alias.name.endswith("MetricFamily")
            }
            for node in ast.walk(tree):
                if isinstance(node, ast.Call):
                    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
                    if (name in prometheus and _labels_given(node, name)) or name == "add_metric":
                        offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert METRIC_LABELS.exists()
    assert offenders == []


# -- hostile traffic against a real cluster ---------------------------------------------------------------------


def _random_name(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(12)) + "/" + str(rng.getrandbits(40))


def _encode(model: str, *, items: int = 1, **fields: object) -> inference_pb2.EncodeRequest:
    return inference_pb2.EncodeRequest(model=model, items=[types_pb2.Item(text="x")] * items, **fields)


def _big_options() -> struct_pb2.Struct:
    options = struct_pb2.Struct()
    options.update({"k" * 20_000: "v"})
    return options


def _refused(call, *args, **kwargs) -> grpc.StatusCode:
    try:
        call(*args, timeout=30, **kwargs)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def _hostile_inference(stub: inference_pb2_grpc.InferenceStub, known: str, rng: random.Random) -> list[str]:
    """Requests every refusal path could turn into a label; the hostile names sent."""
    huge = ["h" * 300_000 + str(index) for index in range(20)]
    names = [_random_name(rng) for _ in range(200)]
    codes: list[grpc.StatusCode] = []
    for name in huge:
        codes.append(_refused(stub.Encode, _encode(name)))
        codes.append(_refused(stub.Encode, _encode(name, items=0)))
    for index, name in enumerate(names):
        codes.append(_refused(stub.Encode, _encode(name, items=index % 2)))
        if index % 4 == 0:
            codes.append(_refused(stub.Encode, _encode(name, options=_big_options())))
            codes.append(_refused(stub.Score, inference_pb2.ScoreRequest(model=name, query=types_pb2.Item(text="q"))))
            codes.append(_refused(stub.Extract, inference_pb2.ExtractRequest(model=name, items=[types_pb2.Item(text="x")])))
            codes.append(_refused(stub.Encode, _encode(known, profile=name)))
            codes.append(_refused(stub.Encode, _encode(known), metadata=(("x-sie-machine-profile", name.replace("/", "-")),)))
            codes.append(_refused(stub.Encode, _encode(known), metadata=(("x-sie-pool", name.replace("/", "-")),)))
    stream = [inference_pb2.EncodeStreamRequest(request=_encode(name, items=index % 2, request_id=name)) for index, name in enumerate(names[:40])]
    answers = list(stub.EncodeStream(iter(stream), timeout=60))
    assert len(answers) == 40 and all(answer.WhichOneof("outcome") == "error" for answer in answers)
    assert codes.count(grpc.StatusCode.INVALID_ARGUMENT) >= 60 and codes.count(grpc.StatusCode.NOT_FOUND) >= 50
    return huge + names


def _scrape(process: WorkerProcess) -> str:
    with urllib.request.urlopen(f"{process.metrics_url}/metrics", timeout=30) as reply:
        return reply.read().decode()


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _bad_labels(metrics: str, allowed: dict[str, set[str]]) -> list[str]:
    """Every label value of `metrics` outside its closed set (or of a label nobody declared)."""
    bad = []
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            for key, value in sample.labels.items():
                if key == "le":
                    ok = _is_number(value)
                elif key == "generation":  # prometheus_client's python_gc_* metrics
                    ok = value.isdigit()
                elif family.name == "python_info":
                    ok = len(value) < 32
                else:
                    ok = value in allowed.get(key, set()) | {UNKNOWN}
                if not ok:
                    bad.append(f"{sample.name}{{{key}={value[:40]!r}{'...' if len(value) > 40 else ''}}}")
    return bad


def test_hostile_traffic_adds_no_label_value_outside_the_closed_sets(cluster, reliability_report) -> None:
    rng = random.Random(32)
    worker = cluster.start_worker("labelled-worker", SIE_PRELOAD_MODELS="test/tiny-mean")
    gateway = cluster.start_gateway()
    known = "test/tiny-mean"
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert len(stub.Encode(_encode(known), timeout=60).results) == 1
        served = {model.id for model in stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10).models}
        sizes_before = {"gateway": len(_scrape(gateway)), "worker": len(_scrape(worker))}
        sent = _hostile_inference(stub, known, rng)
    with grpc.insecure_channel(worker.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert len(stub.Encode(_encode(known), timeout=60).results) == 1
        sent += _hostile_inference(stub, known, rng)
        worker_models = {model.id for model in stub.ListModels(inference_pb2.ListModelsRequest(), timeout=10).models}
    with grpc.insecure_channel(cluster.config.address) as channel:
        admin = config_pb2_grpc.ConfigServiceStub(channel)
        for name in sent[18:60]:
            _refused(admin.GetModelConfig, config_pb2.GetModelConfigRequest(model=name))
            _refused(admin.GetBundle, config_pb2.GetBundleRequest(bundle_id=name))
            _refused(admin.AddModel, config_pb2.AddModelRequest(config={"id": name, "hf_id": name, "profiles": {name: {"adapter": name}}}))

    operations = {"encode", "score", "extract"}
    allowed = {
        "gateway": {"model": served, "operation": operations, "status": STATUS_NAMES, "machine_profile": {"default"}, "pool": {""}},
        "worker": {"model": worker_models, "operation": operations, "status": STATUS_NAMES, "profile": {"default"}, "flush": {"full", "wait"}},
        "config": {"model": {""}, "operation": CONFIG_RPCS, "status": STATUS_NAMES},
    }
    scraped = {"gateway": _scrape(gateway), "worker": _scrape(worker), "config": _scrape(cluster.config)}
    for service, metrics in scraped.items():
        assert _bad_labels(metrics, allowed[service]) == [], service
        assert len(metrics) < MAX_METRICS_BYTES, (service, len(metrics))
        assert not any(name in metrics for name in sent[18:]), service
    # The refusals were counted, under "(unknown)".
    assert f'sie_gateway_requests_total{{model="{UNKNOWN}",operation="encode",status="INVALID_ARGUMENT"}}' in scraped["gateway"]
    assert f'sie_worker_requests_total{{model="{UNKNOWN}",operation="encode",status="INVALID_ARGUMENT"}}' in scraped["worker"]
    assert 'sie_config_requests_total{model="",operation="AddModel",status="INVALID_ARGUMENT"}' in scraped["config"]
    reliability_report.add(
        "metrics",
        "hostile traffic: /metrics bytes before and after",
        gateway=f"{sizes_before['gateway']} -> {len(scraped['gateway'])}",
        worker=f"{sizes_before['worker']} -> {len(scraped['worker'])}",
        config=len(scraped["config"]),
        requests=len(sent) * 2,
    )
