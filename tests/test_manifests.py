"""The Kubernetes manifests (deploy/kustomize) and Dockerfiles (deploy/docker) agree with the services they run.

Every overlay renders with kustomize and validates against Kubernetes' schemas
(and the CRD schemas in tests/data/crds); then ports, SIE_* variables, probes,
Services, NetworkPolicies, ServiceMonitors and the KEDA objects are checked
against the services' settings classes and against each other.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import re
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from manifests import ENVOY_CONFIG, OVERLAYS, ROOT, envoy_config, render, stale_files, validation_errors
from sie.v1 import config_pb2, inference_pb2, inference_pb2_grpc, types_pb2
from sie_common.cluster.config_messages import config_from_message
from sie_common.runtime.settings import load_settings
from grpc_helpers import error_reason
from worker_process import free_port

# kustomize renders the overlays, Envoy validates its config: subprocesses.
pytestmark = pytest.mark.process

DOCKER_DIR = ROOT / "deploy" / "docker"
PYPROJECTS = {str(path.parent.relative_to(ROOT)): tomllib.loads(path.read_text()) for path in ROOT.glob("*/*/pyproject.toml")}
# Each console script -> its entry point, and the folder of the distribution that provides it.
SCRIPTS = {script: target for project in PYPROJECTS.values() for script, target in project["project"].get("scripts", {}).items()}
SCRIPT_FOLDERS = {script: folder for folder, project in PYPROJECTS.items() for script in project["project"].get("scripts", {})}
WORKLOADS = ("Deployment", "StatefulSet")
CRD_KINDS = ("ScaledObject", "ServiceMonitor")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}


def settings_for_script(script: str) -> type:
    """The settings dataclass of the service a console script runs (`sie-worker` -> WorkerSettings)."""
    package = SCRIPTS[script].split(".")[0]
    module = importlib.import_module(f"{package}.settings")
    (settings,) = [
        value
        for name, value in vars(module).items()
        if name.endswith("Settings") and dataclasses.is_dataclass(value) and value.__module__ == module.__name__
    ]
    return settings


def settings_for_image(image: str) -> type | None:
    """Our images are named after their service: sie-gateway, sie-config, sie-worker-cpu, sie-worker-cuda."""
    name = image.rsplit("/", 1)[-1].split(":")[0]
    script = next((script for script in ("sie-worker", "sie-gateway", "sie-config") if name.startswith(script)), None)
    return settings_for_script(script) if script else None


def field(settings: type, name: str) -> dataclasses.Field:
    fields = {f.name: f for f in dataclasses.fields(settings)}
    assert name in fields, f"{settings.__name__} has no {name!r} setting (metrics_port comes with branch obs)"
    return fields[name]


def setting_value(settings: type, name: str, env: dict[str, str]) -> str:
    """A setting as a container sees it: its variable from the manifest, else its default."""
    f = field(settings, name)
    return env.get(f.metadata["env"], str(f.default))


def pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] in WORKLOADS]


def our_containers(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any], type]]:
    """(workload, container, settings) for every container that runs one of our services."""
    found = []
    for workload in pod_templates(objects):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            if settings := settings_for_image(container["image"]):
                found.append((workload, container, settings))
    return found


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {var["name"]: var.get("value", "") for var in container.get("env", [])}


def ports_of(container: dict[str, Any]) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container.get("ports", [])}


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (obj,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return obj


def selected_workloads(objects: list[dict[str, Any]], match_labels: dict[str, str]) -> list[dict[str, Any]]:
    return [w for w in pod_templates(objects) if match_labels.items() <= w["spec"]["template"]["metadata"]["labels"].items()]


# -- generated files and schemas --------------------------------------------------------------


def test_generated_files_are_current_and_envoy_accepts_its_config() -> None:
    assert stale_files() == [], "run `make manifests`"
    envoy = Path(sys.executable).parent / "envoy"
    result = subprocess.run([str(envoy), "--mode", "validate", "-c", str(ENVOY_CONFIG)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates(rendered, overlay: str) -> None:
    objects = rendered[overlay]
    assert validation_errors(objects) == []
    kinds = {obj["kind"] for obj in objects}
    assert {"StatefulSet", "Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    assert {obj["metadata"].get("namespace") for obj in objects if obj["kind"] != "Namespace"} == {"sie"}
    if overlay == "gpu":
        assert set(CRD_KINDS) <= kinds
    else:  # local runs on a bare cluster: no KEDA, no Prometheus Operator
        assert not set(CRD_KINDS) & kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_envoy_loads_its_config_and_reaches_every_gateway_and_config_pod(rendered, overlay: str) -> None:
    objects = rendered[overlay]
    envoy = one(objects, "Deployment", "sie-envoy")["spec"]["template"]["spec"]
    (container,) = envoy["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in envoy["volumes"] if v["name"] == mount["name"]]
    config_map = one(objects, "ConfigMap", volume["configMap"]["name"])
    config_path = container["args"][container["args"].index("-c") + 1]
    assert config_path == f"{mount['mountPath']}/envoy.json"
    config = json.loads(config_map["data"]["envoy.json"])
    assert config == envoy_config()
    (listener,) = config["static_resources"]["listeners"]
    assert listener["address"]["socket_address"]["port_value"] == ports_of(container)["http"]
    # The admin can stop Envoy: loopback only; the preStop drains through it from inside the pod (drain.sh, from the
    # same ConfigMap), and readiness goes through the listener.
    admin = config["admin"]["address"]["socket_address"]
    assert admin["address"] == "127.0.0.1" and "admin" not in ports_of(container)
    prestop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert prestop[1:3] == [f"{mount['mountPath']}/drain.sh", f"127.0.0.1:{admin['port_value']}"]
    assert "drain.sh" in config_map["data"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for cluster in config["static_resources"]["clusters"]:
        (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        address = endpoint["endpoint"]["address"]["socket_address"]
        service = one(objects, "Service", address["address"])
        assert service["spec"]["clusterIP"] == "None", "STRICT_DNS over a headless Service: Envoy balances over every pod"
        assert address["port_value"] in {p["port"] for p in service["spec"]["ports"]}


def test_validation_rejects_what_the_api_server_would(rendered) -> None:
    objects = rendered["gpu"]
    gateway = copy.deepcopy(one(objects, "Deployment", "sie-gateway"))
    gateway["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "50051"
    probe_typo = copy.deepcopy(one(objects, "Deployment", "sie-gateway"))
    probe_typo["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grcp"] = {"port": 50051}
    scaled = copy.deepcopy(one(objects, "ScaledObject", "sie-worker-l4"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 32  # KEDA metadata values are strings
    monitor = copy.deepcopy(one(objects, "ServiceMonitor", "sie-gateway"))
    monitor["spec"]["endpoints"][0]["interval"] = "ten seconds"
    errors = validation_errors([gateway, probe_typo, scaled, monitor])
    assert [error.split(":")[0] for error in errors] == [
        "Deployment/sie-gateway", "Deployment/sie-gateway", "ScaledObject/sie-worker-l4", "ServiceMonitor/sie-gateway",
    ]


# -- the manifests agree with the services' settings ------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_containers_agree_with_their_service_settings(rendered, overlay: str) -> None:
    objects = rendered[overlay]
    containers = our_containers(objects)
    assert {settings.__name__ for _, _, settings in containers} == {"ConfigSettings", "GatewaySettings", "WorkerSettings"}
    for workload, container, settings in containers:
        where = f"{overlay} {workload['metadata']['name']}"
        env = env_of(container)
        known = {f.metadata["env"] for f in dataclasses.fields(settings)}
        unknown = sorted(name for name in env if name.startswith("SIE_") and name not in known)
        assert unknown == [], f"{where}: not settings of {settings.__name__}: {unknown}"
        # The service accepts every value as the kubelet would pass it ($(POD_IP) expanded).
        load_settings(settings, environ={name: value.replace("$(POD_IP)", "10.0.0.7") for name, value in env.items()})
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True, where
        assert container["securityContext"]["allowPrivilegeEscalation"] is False, where
        ports = ports_of(container)
        grpc_port = int(setting_value(settings, "port", env))
        assert ports["grpc"] == grpc_port, where
        assert ports["metrics"] == int(setting_value(settings, "metrics_port", env)), where
        assert container["readinessProbe"]["grpc"]["port"] == grpc_port, where
        if "startupProbe" in container:
            assert container["startupProbe"]["grpc"]["port"] == grpc_port, where
        liveness = container["livenessProbe"]
        assert (liveness.get("grpc") or liveness["tcpSocket"])["port"] == grpc_port, where
        if "SIE_ADVERTISE_ADDRESS" in env:
            assert env["SIE_ADVERTISE_ADDRESS"] == f"$(POD_IP):{grpc_port}", where
            names = [var["name"] for var in container["env"]]
            assert names.index("POD_IP") < names.index("SIE_ADVERTISE_ADDRESS"), "$(POD_IP) expands only after its definition"
            assert container["env"][names.index("POD_IP")]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        # etcd endpoints name the etcd client Service and its port
        for endpoint in setting_value(settings, "etcd_endpoints", env).split(","):
            host, port = endpoint.split(":")
            service = one(objects, "Service", host)
            assert int(port) in {p["port"] for p in service["spec"]["ports"]}, where
            assert selected_workloads(objects, service["spec"]["selector"])[0]["kind"] == "StatefulSet"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_reach_named_container_ports(rendered, overlay: str) -> None:
    objects = rendered[overlay]
    for service in [obj for obj in objects if obj["kind"] == "Service"]:
        workloads = selected_workloads(objects, service["spec"]["selector"])
        assert workloads, f"{overlay}: Service {service['metadata']['name']} selects no pods"
        for workload in workloads:
            container_ports = {}
            for container in workload["spec"]["template"]["spec"]["containers"]:
                container_ports |= ports_of(container)
            for port in service["spec"]["ports"]:
                assert container_ports.get(port["targetPort"]) == port["port"], f"{overlay}: {service['metadata']['name']} {port}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policies_admit_every_served_port(rendered, overlay: str) -> None:
    """Ingress is denied by default; each port a pod serves to others has a policy letting it in."""
    objects = rendered[overlay]
    policies = [obj for obj in objects if obj["kind"] == "NetworkPolicy"]
    for workload in pod_templates(objects):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        applying = [p for p in policies if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert any("ingress" not in p["spec"] for p in applying), "the default deny applies"
        admitted = {port["port"] for p in applying for rule in p["spec"].get("ingress", []) for port in rule.get("ports", [])}
        served = {number for container in workload["spec"]["template"]["spec"]["containers"] for name, number in ports_of(container).items() if name != "admin"}
        assert served <= admitted, f"{overlay}: {workload['metadata']['name']} serves {sorted(served - admitted)} to nobody"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_etcd_initial_cluster_names_every_member(rendered, overlay: str) -> None:
    objects = rendered[overlay]
    etcd = one(objects, "StatefulSet", "sie-etcd")
    (container,) = etcd["spec"]["template"]["spec"]["containers"]
    env = env_of(container)
    peers = one(objects, "Service", etcd["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    peer_port = ports_of(container)["peer"]
    expected = ",".join(f"sie-etcd-{i}=http://sie-etcd-{i}.{peers['metadata']['name']}:{peer_port}" for i in range(etcd["spec"]["replicas"]))
    assert env["ETCD_INITIAL_CLUSTER"] == expected
    assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == f"http://$(ETCD_NAME).{peers['metadata']['name']}:{peer_port}"
    names = [var["name"] for var in container["env"]]
    assert names.index("ETCD_NAME") < names.index("ETCD_INITIAL_ADVERTISE_PEER_URLS") < names.index("ETCD_ADVERTISE_CLIENT_URLS")
    assert env["ETCD_LISTEN_CLIENT_URLS"].endswith(f":{ports_of(container)['client']}")
    assert etcd["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in {m["name"] for m in container["volumeMounts"]}
    assert etcd["spec"]["replicas"] == {"local": 1, "gpu": 3}[overlay]


def test_local_overlay_is_one_of_each_on_cpu(rendered) -> None:
    objects = rendered["local"]
    assert {w["metadata"]["name"]: w["spec"]["replicas"] for w in pod_templates(objects)} == {
        "sie-etcd": 1, "sie-config": 1, "sie-gateway": 1, "sie-envoy": 1, "sie-worker": 1,
    }
    worker = one(objects, "Deployment", "sie-worker")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(worker)["SIE_DEVICE"] == "cpu"
    assert worker["image"].startswith("sie-worker-cpu:")
    assert "nvidia.com/gpu" not in worker["resources"]["requests"]
    hpa = one(objects, "HorizontalPodAutoscaler", "sie-gateway")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 1)
    # A Job adds the demo model through Envoy, with a body AddModel accepts.
    job = one(objects, "Job", "sie-add-demo-model")["spec"]["template"]["spec"]
    (curl,) = job["containers"]
    url = curl["args"][-1]
    envoy = one(objects, "Service", "sie-envoy")
    assert url == f"http://{envoy['metadata']['name']}:{envoy['spec']['ports'][0]['port']}/v1/configs/models"
    body = curl["args"][curl["args"].index("--data") + 1].removeprefix("@")
    (mount,) = curl["volumeMounts"]
    (volume,) = [v for v in job["volumes"] if v["name"] == mount["name"]]
    data = one(objects, "ConfigMap", volume["configMap"]["name"])["data"][Path(body).relative_to(mount["mountPath"]).as_posix()]
    model = config_from_message(json_format.ParseDict(json.loads(data), config_pb2.ModelConfig()), source="demo-model.json")
    assert model.id in env_of(worker)["SIE_PRELOAD_MODELS"].split(",")


# -- scale from zero --------------------------------------------------------------------------

QUERY = re.compile(r'^sum\((?P<metric>[a-z_]+)\{(?P<labels>[^}]*)\}\)$')


def test_each_gpu_profile_has_its_worker_deployment_and_scaled_object(rendered) -> None:
    objects = rendered["gpu"]
    gateway_env = env_of(one(objects, "Deployment", "sie-gateway")["spec"]["template"]["spec"]["containers"][0])
    configured = gateway_env["SIE_GATEWAY_CONFIGURED_GPUS"].split(",")
    scaled_objects = [obj for obj in objects if obj["kind"] == "ScaledObject"]
    profiles = []
    for scaled in scaled_objects:
        target = scaled["spec"]["scaleTargetRef"]
        assert (target.get("apiVersion", "apps/v1"), target.get("kind", "Deployment")) == ("apps/v1", "Deployment")
        deployment = one(objects, "Deployment", target["name"])
        assert "replicas" not in deployment["spec"], "KEDA owns the replica count"
        assert scaled["spec"]["minReplicaCount"] == 0
        pod = deployment["spec"]["template"]["spec"]
        (worker,) = pod["containers"]
        env = env_of(worker)
        profile = env["SIE_MACHINE_PROFILE"]
        profiles.append(profile)
        assert deployment["metadata"]["name"] == f"sie-worker-{profile}"
        assert deployment["spec"]["template"]["metadata"]["labels"]["sie.dev/machine-profile"] == profile
        assert env["SIE_BUNDLE"] and env["SIE_DEVICE"] == "cuda" and worker["image"].startswith("sie-worker-cuda:")
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
        # The trigger reads the gateway's demand for exactly this profile.
        (trigger,) = scaled["spec"]["triggers"]
        assert trigger["type"] == "prometheus"
        match = QUERY.match(trigger["metadata"]["query"])
        assert match and match["metric"] == "sie_gateway_demand", trigger["metadata"]["query"]
        assert dict(re.findall(r'(\w+)="([^"]*)"', match["labels"])) == {"machine_profile": profile}
        assert float(trigger["metadata"]["activationThreshold"]) == 0 < float(trigger["metadata"]["threshold"])
    assert sorted(profiles) == sorted(configured) == ["a100-80gb", "l4"]


def test_service_monitors_scrape_each_metrics_port_once(rendered) -> None:
    """Prometheus gets every pod's metrics port exactly once (a second Service on it would double the demand KEDA sums)."""
    objects = rendered["gpu"]
    scraped = []
    for monitor in [obj for obj in objects if obj["kind"] == "ServiceMonitor"]:
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        services = [s for s in objects if s["kind"] == "Service" and monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        for service in services:
            for port in [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]:
                for workload in selected_workloads(objects, service["spec"]["selector"]):
                    (container,) = workload["spec"]["template"]["spec"]["containers"]
                    assert port["port"] == int(setting_value(settings_for_image(container["image"]), "metrics_port", env_of(container)))
                    scraped.append(workload["metadata"]["name"])
    assert sorted(scraped) == sorted(name for name in ("sie-config", "sie-gateway", "sie-worker-l4", "sie-worker-a100-80gb"))


# -- Dockerfiles ------------------------------------------------------------------------------


def dockerfile_stages(path: Path) -> dict[str, dict[str, Any]]:
    """Each stage's ENTRYPOINT, EXPOSEd ports, ENV names, USER, the folders it pip installs and whether it installs torch
    (a stage inherits its base stage's ENV, USER, installs and torch)."""
    stages: dict[str, dict[str, Any]] = {}
    current: dict[str, Any] = {}
    for line in path.read_text().replace("\\\n", " ").splitlines():
        instruction, _, rest = line.strip().partition(" ")
        if instruction == "FROM":
            base, _, name = rest.partition(" AS ")
            inherited = stages.get(base.strip(), {"env": set(), "installs": set(), "torch": False})
            current = {
                "entrypoint": None, "expose": set(), "env": set(inherited["env"]), "user": inherited.get("user"),
                "installs": set(inherited["installs"]), "torch": inherited["torch"],
            }
            stages[name.strip() or path.name] = current
        elif instruction == "ENTRYPOINT":
            current["entrypoint"] = re.findall(r'"([^"]+)"', rest)
        elif instruction == "EXPOSE":
            current["expose"] |= {int(port) for port in rest.split()}
        elif instruction == "USER":
            current["user"] = rest.strip()
        elif instruction == "ENV":
            current["env"] |= set(re.findall(r"(\w+)=", rest))
        elif instruction == "RUN" and "pip install" in rest:
            current["installs"] |= set(re.findall(r"(?:\./|/src/)([\w/]+)", rest))
            current["torch"] |= '"${TORCH}"' in rest
    return stages


def test_dockerfiles_run_console_scripts_on_their_settings_ports(rendered) -> None:
    images = {}
    for path in sorted(DOCKER_DIR.glob("*Dockerfile")):
        for name, stage in dockerfile_stages(path).items():
            entrypoint = stage["entrypoint"] or []
            if not any(part.startswith("sie-") for part in entrypoint):
                continue  # a stage of no service's (the Envoy of `sie up --images`, test_manifest_containers.py)
            init = ["dumb-init", "--single-child", "--"]  # PID 1 passes signals on (tests/test_image_signals.py)
            assert entrypoint[:3] == init, f"{path.name} {name}: the service runs under {' '.join(init)}"
            (script,) = entrypoint[3:]
            assert script in SCRIPTS, f"{path.name} {name}: {script} is not a console script of a distribution"
            assert SCRIPT_FOLDERS[script] in stage["installs"], f"{path.name} {name}: {script}'s distribution is not installed"
            assert stage["torch"] == (script == "sie-worker"), f"{path.name} {name}: torch only in the worker's images"
            assert stage["user"] and int(stage["user"]) > 0, f"{path.name} {name}: a numeric non-root USER (the pods set runAsNonRoot)"
            settings = settings_for_script(script)
            defaults = {f.name: f.default for f in dataclasses.fields(settings)}
            assert stage["expose"] == {defaults["port"], field(settings, "metrics_port").default}, f"{path.name} {name}"
            known = {f.metadata["env"] for f in dataclasses.fields(settings)}
            assert {env for env in stage["env"] if env.startswith("SIE_")} <= known, f"{path.name} {name}"
            image = name if path.name == "Dockerfile" else path.name.removesuffix(".Dockerfile")
            images[f"sie-{image}" if not image.startswith("sie-") else image] = settings
    used = {c["image"].split(":")[0]: s for objects in rendered.values() for _, c, s in our_containers(objects)}
    assert {name: images.get(name) for name in used} == used, "every image the manifests run is built by a Dockerfile"


def test_dockerfiles_copy_what_the_repository_has() -> None:
    for path in sorted(DOCKER_DIR.glob("*Dockerfile")):
        for sources in re.findall(r"^COPY (.+) \S+$", path.read_text(), re.M):
            for source in sources.split():
                assert (ROOT / source).exists(), f"{path.name}: COPY {source}: not in the repository"


def test_images_pin_torch_as_bootstrap_does() -> None:
    (pin,) = re.findall(r"SIE_TORCH:-(torch==[\d.]+)", (ROOT / "scripts" / "bootstrap").read_text())
    cpu = (DOCKER_DIR / "Dockerfile").read_text()
    cuda = (DOCKER_DIR / "worker-cuda.Dockerfile").read_text()
    assert f"ARG TORCH={pin}" in cpu and f"ARG TORCH={pin}" in cuda
    assert "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in cpu
    assert cuda.startswith("# syntax") and re.search(r"^FROM nvidia/cuda:\S+", cuda, re.M)
    # torch is installed before the worker, so installing the worker keeps that build.
    for text in (cpu, cuda):
        assert text.index('"${TORCH}"') < text.index("services/worker")


def test_keda_queries_read_the_demand_a_gateway_with_the_overlays_environment_publishes(rendered, cluster) -> None:
    """A real gateway, run with the gpu overlay's environment: one request per profile that has no
    worker, then each ScaledObject's query, evaluated on the gateway's /metrics, wakes its profile."""
    from prometheus_client.parser import text_string_to_metric_families  # with branch obs

    objects = rendered["gpu"]
    container = one(objects, "Deployment", "sie-gateway")["spec"]["template"]["spec"]["containers"][0]
    settings = settings_for_image(container["image"])
    metrics_port = free_port()
    env = {**env_of(container), field(settings, "metrics_port").metadata["env"]: str(metrics_port)}
    for name in ("SIE_ETCD_ENDPOINTS", "SIE_ETCD_USERNAME", "SIE_ETCD_PASSWORD_FILE"):
        del env[name]  # the test's etcd instead, which has no authentication
    gateway = cluster.start_gateway(**env)
    scaled_objects = [obj for obj in objects if obj["kind"] == "ScaledObject"]
    with grpc.insecure_channel(gateway.address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        for scaled in scaled_objects:
            deployment = one(objects, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
            profile = env_of(deployment["spec"]["template"]["spec"]["containers"][0])["SIE_MACHINE_PROFILE"]
            request = inference_pb2.EncodeRequest(model="test/tiny-mean", items=[types_pb2.Item(text="wake up")])
            with pytest.raises(grpc.RpcError) as raised:
                stub.Encode(request, metadata=(("x-sie-machine-profile", profile),), timeout=10)
            assert error_reason(raised.value) == "PROVISIONING"
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as reply:
        samples = [s for family in text_string_to_metric_families(reply.read().decode()) for s in family.samples]

    def evaluate(query: str) -> float:
        match = QUERY.match(query)
        assert match, query
        wanted = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
        return sum(s.value for s in samples if s.name == match["metric"] and wanted.items() <= s.labels.items())

    for scaled in scaled_objects:
        (trigger,) = scaled["spec"]["triggers"]
        assert evaluate(trigger["metadata"]["query"]) == 1 > float(trigger["metadata"]["activationThreshold"]), scaled["metadata"]["name"]
    assert evaluate('sum(sie_gateway_demand{machine_profile="h100"})') == 0  # nobody asked for it: stays at zero
