"""Every container of every rendered Kubernetes overlay, run against its image as a kubelet would run it.

podman (or docker) stands in for a cluster we do not have: each overlay runs in
one network namespace of its own (every Service name resolves to its
loopback), its workloads in dependency order (etcd, the etcd-access Job, the
config service, gateways, workers, Envoy, then the other Jobs). Each container
gets its image, the manifest's command and args (with `$(VAR)` expanded as the
kubelet does), its env (Secrets filled with test values, ConfigMaps from the
render, the Downward API's pod name and IP), its volume mounts (Secrets and
ConfigMaps as files with their modes, emptyDirs, volume claims), its user,
groups, dropped capabilities and memory limit; then its startup, readiness and
liveness probes must pass, every port it names must listen, and every SIE_*
variable it sets must be a setting of the service in the image. A manifest
that names a flag, variable, port or path the image does not have fails here.
Jobs must exit 0. A StatefulSet runs its first member (etcd alone:
ETCD_INITIAL_CLUSTER cut to it, as overlays/local has it). Through the local overlay's Envoy, the demo model the Job
added then answers an encode.

The images are `make images`' (deploy/docker/build-images, built here with a
warm layer cache); third-party images no registry can give us here are
stood in for by the same program (tests/data/images/standins.Dockerfile,
IMAGE_STANDINS); the CUDA worker's specs run on the CPU worker's image with
SIE_DEVICE=cpu (the same code and settings; no GPU here).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from container_images import build_images, engine_or_skip
from manifests import OVERLAYS, ROOT, render
from sie_stack.containers import IMAGE_VERSION, ContainerEngine

pytestmark = [pytest.mark.process, pytest.mark.slow]

ENGINE = engine_or_skip()

STANDINS = ROOT / "tests" / "data" / "images"
# Upstream image (without tag) -> (local stand-in, the version its program must report for the manifest's tag).
IMAGE_STANDINS = {
    "quay.io/coreos/etcd": f"sie-standin-etcd:{IMAGE_VERSION}",
    "curlimages/curl": f"sie-standin-curl:{IMAGE_VERSION}",
    "envoyproxy/envoy": f"sie-envoy:{IMAGE_VERSION}",
    # No GPU here: the CUDA worker's specs run on the CPU worker's image, with SIE_DEVICE=cpu.
    "sie-worker-cuda": f"sie-worker-cpu:{IMAGE_VERSION}",
}
# The order a cluster settles in: each component needs those before it (the services refuse etcd without
# authentication, which the etcd-access Job turns on; Envoy's readiness needs a gateway, the demo-model Job Envoy).
ORDER = ("etcd", "etcd-access", "config", "gateway", "worker", "envoy", "add-demo-model")
# The Secrets the manifests name, with test values (the overlays expect them created beforehand).
SECRETS = {
    "sie-admin-token": {"token": "test-admin-token"},
    "sie-worker-token": {"token": "test-worker-token"},
    **{f"sie-etcd-{user}": {"password": f"test-{user}-password"} for user in ("root", "config", "gateway", "worker")},
}
POD_IP = "127.0.0.1"
# The longest a container may take to pass its readiness probe (a busy 2-core machine imports torch slowly).
READY_TIMEOUT_S = 300
JOB_TIMEOUT_S = 180
# Run inside the namespace's helper container: one probe, exit 0 when it passes.
PROBE = """
import socket, sys, urllib.request
kind, port, arg = sys.argv[1], int(sys.argv[2]), sys.argv[3]
try:
    if kind == "grpc":
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=arg), timeout=2)
        sys.exit(0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1)
    if kind == "httpGet":
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{arg}", timeout=2) as reply:
            sys.exit(0 if 200 <= reply.status < 400 else 1)
    socket.create_connection(("127.0.0.1", port), timeout=2).close()
except Exception as error:
    print(error)
    sys.exit(1)
"""
# Run inside an image of ours: the SIE_* variables its service's settings read.
SETTINGS_VARIABLES = """
import dataclasses, importlib, sys
module = importlib.import_module(sys.argv[1] + ".settings")
names = {f.metadata["env"] for value in vars(module).values() if dataclasses.is_dataclass(value)
         for f in dataclasses.fields(value)}
print("\\n".join(sorted(names)))
"""


def engine() -> ContainerEngine:
    return ENGINE


def run_engine(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([engine().binary, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{engine().binary} {shlex.join(args[:3])}... failed ({result.returncode}):\n{result.stderr}"
        )
    return result


def local_image(image: str) -> str:
    """The image this machine runs for a manifest's image: ours by name, else its stand-in."""
    name = image.rsplit(":", 1)[0]
    return IMAGE_STANDINS.get(name, image)


@pytest.fixture(scope="module")
def images() -> None:
    """`make images` and the stand-ins (the layer cache makes it quick when nothing changed)."""
    build_images("standin-etcd", "standin-curl")


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: render(overlay) for overlay in OVERLAYS}


# -- the stand-in for a node -------------------------------------------------------------------


@dataclass
class Started:
    name: str
    ports: dict[str, int]


@dataclass
class Namespace:
    """One network namespace with a helper container (the config image: Python, gRPC health) that probes from
    inside it; every Service name of the overlay resolves to its loopback."""

    hosts: list[str]
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    containers: list[str] = field(default_factory=list)
    directory: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sie-pods-")))

    def __post_init__(self) -> None:
        self.helper = self._name("helper")
        run_engine(
            "run", "-d", "--name", self.helper, "--network", "none", *engine().run_flags(), *self._hosts(),
            "--entrypoint", "sleep", f"sie-config:{IMAGE_VERSION}", "infinity",
        )  # fmt: skip
        self.containers.append(self.helper)

    def _hosts(self) -> list[str]:
        """The namespace's hosts file, mounted into each container (one that joins another's network may not be given
        --add-host)."""
        hosts = self.directory / "hosts"
        if not hosts.exists():
            hosts.write_text(f"{POD_IP} localhost {' '.join(self.hosts)}\n")
            hosts.chmod(0o644)
            self.directory.chmod(0o755)
        return ["--volume", f"{hosts}:/etc/hosts:ro"]

    def _name(self, what: str) -> str:
        return f"sie-check-{self.tag}-{what}"

    def probe(self, kind: str, port: int, arg: str = "") -> tuple[bool, str]:
        result = run_engine("exec", self.helper, "python", "-c", PROBE, kind, str(port), arg, check=False, timeout=30)
        return result.returncode == 0, (result.stdout + result.stderr).strip()

    def run(
        self, what: str, flags: list[str], image: str, args: list[str], *, wait: bool
    ) -> subprocess.CompletedProcess[str] | str:
        """Start a container in the namespace (detached, or to its end when `wait`)."""
        name = self._name(f"{what}-{len(self.containers)}")
        self.containers.append(name)
        common = [
            "--name", name, "--network", f"container:{self.helper}", *engine().run_flags(), *self._hosts(), *flags,
            image, *args,
        ]  # fmt: skip
        if wait:
            return run_engine("run", *common, check=False, timeout=JOB_TIMEOUT_S)
        run_engine("run", "-d", *common)
        return name

    def running(self, name: str) -> bool:
        return run_engine("inspect", "--format", "{{.State.Running}}", name, check=False).stdout.strip() == "true"

    def logs(self, name: str) -> str:
        result = run_engine("logs", name, check=False)
        return (result.stdout + result.stderr)[-6000:]

    def stop(self, name: str, grace_s: int = 5) -> None:
        run_engine("rm", "--force", "--time", str(grace_s), name, check=False)

    def close(self) -> None:
        for name in reversed(self.containers):
            self.stop(name, grace_s=0 if name == self.helper else 5)
        shutil.rmtree(self.directory, ignore_errors=True)


@pytest.fixture
def namespace_for(rendered) -> Iterator[Any]:
    made: list[Namespace] = []

    def make(objects: list[dict[str, Any]]) -> Namespace:
        made.append(Namespace(service_hosts(objects)))
        return made[-1]

    yield make
    for namespace in made:
        namespace.close()


def service_hosts(objects: list[dict[str, Any]]) -> list[str]:
    """Every name a pod may use for a Service or a StatefulSet member, short and namespaced."""
    namespace = next((o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"), "default")
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "Service"]
    for sts in (o for o in objects if o["kind"] == "StatefulSet"):
        names += [
            f"{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}" for i in range(sts["spec"].get("replicas", 1))
        ]
    return [host for name in names for host in (name, f"{name}.{namespace}", f"{name}.{namespace}.svc.cluster.local")]


# -- a pod spec as the kubelet would run it ----------------------------------------------------


def pod_name(workload: dict[str, Any]) -> str:
    return f"{workload['metadata']['name']}-0"


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: defined variables replaced, `$$` escapes, unknown ones left as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), value)


class MissingSecret(Exception):
    """A Secret (or its key) a container needs does not exist: the kubelet would not start it."""


def container_env(
    container: dict[str, Any], workload: dict[str, Any], secrets: dict[str, dict[str, str]]
) -> dict[str, str]:
    env: dict[str, str] = {}
    for var in container.get("env", []):
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = expand(var.get("value", ""), env)
        elif "fieldRef" in source:
            env[var["name"]] = {"metadata.name": pod_name(workload), "status.podIP": POD_IP}[
                source["fieldRef"]["fieldPath"]
            ]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            value = secrets.get(ref["name"], {}).get(ref["key"])
            if value is None and not ref.get("optional"):
                raise MissingSecret(f"secret {ref['name']} (key {ref['key']}) of {var['name']} does not exist")
            if value is not None:
                env[var["name"]] = value
        else:
            raise AssertionError(f"{var['name']}: valueFrom {sorted(source)} is not handled by this check")
    return env


def volume_flags(
    workload: dict[str, Any], container: dict[str, Any], objects: list[dict[str, Any]],
    secrets: dict[str, dict[str, str]], directory: Path,
) -> list[str]:  # fmt: skip
    """--volume flags for the container's mounts, each volume made under `directory` as the kubelet would make it."""
    spec = workload["spec"]["template"]["spec"]
    group = spec.get("securityContext", {}).get("fsGroup")
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    volumes |= {c["metadata"]["name"]: {"claim": True} for c in workload["spec"].get("volumeClaimTemplates", [])}
    flags = []
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        path = directory / workload["metadata"]["name"] / mount["name"]
        path.mkdir(parents=True, exist_ok=True)
        if "secret" in volume or "configMap" in volume:
            if "secret" in volume:
                name, mode = volume["secret"]["secretName"], volume["secret"].get("defaultMode", 0o644)
                if name not in secrets:
                    raise MissingSecret(f"secret {name} of volume {mount['name']} does not exist")
                files = secrets[name]
            else:
                name, mode = volume["configMap"]["name"], volume["configMap"].get("defaultMode", 0o644)
                (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == name]
                files = config_map["data"]
            for key, text in files.items():
                (path / key).write_text(text)
                (path / key).chmod(mode)
                if group is not None:
                    shutil.chown(path / key, 0, group)  # the kubelet gives them to the pod's fsGroup
            path.chmod(0o755)
        else:  # emptyDir, a volume claim: an empty directory every user may write, as a fresh volume is
            path.chmod(0o777)
        flags += ["--volume", f"{path}:{mount['mountPath']}{':ro' if mount.get('readOnly') else ''}"]
    return flags


def security_flags(workload: dict[str, Any], container: dict[str, Any], image: str) -> list[str]:
    spec = workload["spec"]["template"]["spec"]
    pod, own = spec.get("securityContext", {}), container.get("securityContext", {})
    user = own.get("runAsUser", pod.get("runAsUser"))
    group = own.get("runAsGroup", pod.get("runAsGroup"))
    flags = ["--user", f"{user}:{group}" if group is not None else str(user)] if user is not None else []
    if own.get("runAsNonRoot", pod.get("runAsNonRoot")):
        image_user = run_engine("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip()
        effective = str(user) if user is not None else image_user.split(":")[0]
        assert effective.isdigit() and int(effective) > 0, (
            f"{container['name']}: runAsNonRoot, but {image} runs as {image_user or 'root'!r}: the kubelet refuses a "
            "user that is not a numeric non-zero uid"
        )
    if pod.get("fsGroup") is not None:
        flags += ["--group-add", str(pod["fsGroup"])]
    if "ALL" in own.get("capabilities", {}).get("drop", []):
        flags += ["--cap-drop", "ALL"]
    if own.get("allowPrivilegeEscalation") is False:
        flags += ["--security-opt", "no-new-privileges"]
    if own.get("readOnlyRootFilesystem"):
        # As the kubelet has it: no tmpfs at /tmp, /var/tmp or /run (podman's --read-only adds them; docker's does not).
        flags += ["--read-only", *(["--read-only-tmpfs=false"] if engine().is_podman else [])]
    if memory := container.get("resources", {}).get("limits", {}).get("memory"):
        flags += ["--memory", memory.replace("Gi", "g").replace("Mi", "m")]
    return flags


def run_container(
    namespace: Namespace, workload: dict[str, Any], container: dict[str, Any], objects: list[dict[str, Any]],
    secrets: dict[str, dict[str, str]] = SECRETS, *, wait: bool = False,
) -> Any:  # fmt: skip
    image = local_image(container["image"])
    env = container_env(container, workload, secrets)
    if container["image"].startswith("sie-worker-cuda"):
        env["SIE_DEVICE"] = "cpu"
    if "ETCD_INITIAL_CLUSTER" in env:
        # One network namespace holds one member (they would share ports): the first alone, as overlays/local has it.
        env["ETCD_INITIAL_CLUSTER"] = env["ETCD_INITIAL_CLUSTER"].split(",")[0]
    flags = [
        *security_flags(workload, container, image),
        *volume_flags(workload, container, objects, secrets, namespace.directory),
        *[flag for key, value in env.items() for flag in ("--env", f"{key}={value}")],
    ]
    if "command" in container:
        flags += ["--entrypoint", json.dumps([expand(part, env) for part in container["command"]])]
    args = [expand(arg, env) for arg in container.get("args", [])]
    what = f"{workload['metadata']['name']}-{container['name']}"
    return namespace.run(what, flags, image, args, wait=wait)


def ports_of(container: dict[str, Any]) -> dict[str, int]:
    return {port.get("name", str(port["containerPort"])): port["containerPort"] for port in container.get("ports", [])}


def probe_args(probe: dict[str, Any], ports: dict[str, int]) -> tuple[str, int, str]:
    (kind,) = [key for key in ("grpc", "httpGet", "tcpSocket", "exec") if key in probe]
    assert kind != "exec", "exec probes are not handled by this check"
    port = probe[kind]["port"]
    port = ports[port] if isinstance(port, str) else int(port)
    return kind, port, probe[kind].get("path", probe[kind].get("service", ""))


def wait_ready(namespace: Namespace, name: str, container: dict[str, Any]) -> None:
    """Until the startup and readiness probes pass (within the startup probe's allowance, at most READY_TIMEOUT_S);
    then the liveness probe and a connection to every named port."""
    ports = ports_of(container)
    for which in ("startupProbe", "readinessProbe"):
        if which not in container:
            continue
        kind, port, arg = probe_args(container[which], ports)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            assert namespace.running(name), f"{name} exited before its {which} passed:\n{namespace.logs(name)}"
            passed, said = namespace.probe(kind, port, arg)
            if passed:
                break
            assert time.monotonic() < deadline, (
                f"{name}: {which} ({kind} :{port}) failing: {said}\n{namespace.logs(name)}"
            )
            time.sleep(1)
    if "livenessProbe" in container:
        passed, said = namespace.probe(*probe_args(container["livenessProbe"], ports))
        assert passed, f"{name}: livenessProbe failed: {said}\n{namespace.logs(name)}"
    for port_name, port in ports.items():
        passed, said = namespace.probe("tcpSocket", port)
        assert passed, f"{name}: port {port_name} ({port}) does not listen: {said}\n{namespace.logs(name)}"


def unknown_variables(container: dict[str, Any]) -> list[str]:
    """The SIE_* variables the container sets that its service's settings (in its image) do not read."""
    image = local_image(container["image"])
    entrypoint = run_engine("image", "inspect", "--format", "{{json .Config.Entrypoint}}", image).stdout
    # The service's command, after the init that runs it (dumb-init ... -- sie-worker).
    script = next((part for part in json.loads(entrypoint) or [] if part.startswith("sie-")), "")
    if "command" in container or not script:
        return []
    module = script.replace("-", "_")
    known = run_engine(
        "run", "--rm", *engine().run_flags(), "--entrypoint", "python", image, "-c", SETTINGS_VARIABLES, module
    )
    names = {var["name"] for var in container.get("env", []) if var["name"].startswith("SIE_")}
    return sorted(names - set(known.stdout.split()))


def workloads_in_order(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet", "Job")]
    components = {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads}
    assert components <= set(ORDER), f"components {sorted(components - set(ORDER))} have no place in ORDER"
    return sorted(workloads, key=lambda w: ORDER.index(w["metadata"]["labels"]["app.kubernetes.io/component"]))


# -- the checks --------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_runs_against_its_image_with_its_probes_passing(
    images, rendered, namespace_for, overlay: str
) -> None:
    objects = rendered[overlay]
    namespace = namespace_for(objects)
    holding: dict[int, str] = {}  # port -> the container listening on it (two worker profiles share theirs)
    for workload in workloads_in_order(objects):
        for container in workload["spec"]["template"]["spec"]["containers"]:
            assert not unknown_variables(container), f"{workload['metadata']['name']}: variables its image ignores"
            if workload["kind"] == "Job":
                result = run_container(namespace, workload, container, objects, wait=True)
                assert result.returncode == 0, (
                    f"Job {workload['metadata']['name']}: exit {result.returncode}:\n{result.stdout}{result.stderr}"
                )
                continue
            for port in ports_of(container).values():
                if port in holding:
                    namespace.stop(holding.pop(port))
            name = run_container(namespace, workload, container, objects)
            wait_ready(namespace, name, container)
            holding |= dict.fromkeys(ports_of(container).values(), name)
    if overlay == "local":  # the demo model the Job added answers through Envoy
        script = (
            "import json, urllib.request; request = urllib.request.Request('http://127.0.0.1:8080/v1/encode/"
            "sentence-transformers/all-MiniLM-L6-v2', data=json.dumps({'items': [{'text': 'hello'}]}).encode()); "
            "print(len(json.load(urllib.request.urlopen(request, timeout=60))['results'][0]['dense']['values']))"
        )
        answer = run_engine("exec", namespace.helper, "python", "-c", script, timeout=90)
        assert answer.stdout.strip() == "384"
        envoy_workload, envoy = one_container(objects, "Deployment", "sie-envoy")
        check_prestop_drains(namespace, holding[ports_of(envoy)["http"]], envoy_workload, envoy)


# Run in the helper: a POST of an encode whose body stops halfway for argv[1] seconds (a request in flight at Envoy),
# then its status and the vector's length.
SLOW_ENCODE = """
import http.client, json, socket, sys, time
body = json.dumps({"items": [{"text": "hello"}]}).encode()
sock = socket.create_connection(("127.0.0.1", 8080), timeout=120)
sock.sendall(b"POST /v1/encode/sentence-transformers/all-MiniLM-L6-v2 HTTP/1.1\\r\\nhost: sie-envoy\\r\\n"
             b"content-type: application/json\\r\\ncontent-length: %d\\r\\n\\r\\n" % len(body) + body[:10])
print("sent", flush=True)
time.sleep(float(sys.argv[1]))
sock.sendall(body[10:])
reply = http.client.HTTPResponse(sock)
reply.begin()
print(reply.status, len(json.load(reply)["results"][0]["dense"]["values"]), flush=True)
"""
# How long the request above waits halfway: longer than the preStop's shortest wait, so only waiting for the request
# in flight keeps the preStop running until it is answered.
SLOW_ENCODE_PAUSE_S = 8


def check_prestop_drains(namespace: Namespace, name: str, workload: dict[str, Any], container: dict[str, Any]) -> None:
    """Envoy's preStop, run as the kubelet runs it when the pod is deleted, with a request in flight: it returns only
    once that request is answered (in full), the pod's readiness fails from its start, and the grace period covers
    it; Envoy then stops on SIGTERM. (Envoy alone closes every connection at once on SIGTERM.)"""
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    longest_s = int(command[-1])  # drain.sh's MAX_WAIT_S
    grace_s = workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= longest_s + 10, f"terminationGracePeriodSeconds {grace_s}: the preStop may take {longest_s} s"
    client = subprocess.Popen(
        [engine().binary, "exec", namespace.helper, "python", "-c", SLOW_ENCODE, str(SLOW_ENCODE_PAUSE_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "sent", client.stderr
        began = time.monotonic()
        prestop = run_engine("exec", name, *command, timeout=longest_s + 30, check=False)
        took_s = time.monotonic() - began
        assert prestop.returncode == 0, prestop.stdout + prestop.stderr
        out, err = client.communicate(timeout=30)
        assert out.split() == ["200", "384"], out + err
        assert took_s >= SLOW_ENCODE_PAUSE_S - 2, f"the preStop returned after {took_s:.1f} s, before the request ended"
        assert took_s < longest_s, f"the preStop took {took_s:.1f} s: it did not see the request end"
        assert namespace.probe("httpGet", ports_of(container)["http"], container["readinessProbe"]["httpGet"]["path"])[
            0
        ] is False, "readiness still passes after the preStop"
    finally:
        client.kill()
    stopped = run_engine("stop", "--time", str(grace_s), name, timeout=grace_s + 30)
    assert stopped.returncode == 0 and not namespace.running(name)


# -- hostile starts: each fails at once, saying what is wrong ------------------------------------


def one_container(objects: list[dict[str, Any]], kind: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    (workload,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return workload, workload["spec"]["template"]["spec"]["containers"][0]


def exit_of(namespace: Namespace, name: str, timeout_s: float = READY_TIMEOUT_S) -> tuple[int, str]:
    """The container's exit code and log, once it has exited (it must, within `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while namespace.running(name):
        assert time.monotonic() < deadline, f"{name} still runs after {timeout_s} s:\n{namespace.logs(name)}"
        time.sleep(1)
    code = run_engine("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
    return int(code), namespace.logs(name)


def without_mount(container: dict[str, Any], volume: str) -> dict[str, Any]:
    return {**container, "volumeMounts": [m for m in container["volumeMounts"] if m["name"] != volume]}


def test_a_missing_secret_stops_the_pod_and_a_missing_password_file_stops_the_service(
    images, rendered, namespace_for
) -> None:
    objects = rendered["local"]
    workload, container = one_container(objects, "Deployment", "sie-config")
    namespace = namespace_for(objects)
    secrets = {name: keys for name, keys in SECRETS.items() if name != "sie-etcd-config"}
    with pytest.raises(MissingSecret, match="secret sie-etcd-config of volume etcd-password does not exist"):
        run_container(namespace, workload, container, objects, secrets)  # the kubelet would not start it
    # The image, started without the Secret's volume (the file its variable names is not there): exit 1, naming it.
    name = run_container(namespace, workload, without_mount(container, "etcd-password"), objects)
    code, log = exit_of(namespace, name)
    assert code == 1, log
    assert "cannot read SIE_ETCD_PASSWORD_FILE /etc/sie/etcd/password" in log


def test_a_wrong_etcd_endpoint_stops_the_service_naming_it(images, rendered, namespace_for) -> None:
    objects = rendered["local"]
    workload, container = one_container(objects, "Deployment", "sie-gateway")
    env = [
        v if v["name"] != "SIE_ETCD_ENDPOINTS" else {**v, "value": "sie-etcd-elsewhere:2379"} for v in container["env"]
    ]
    namespace = namespace_for(objects)
    name = run_container(namespace, workload, {**container, "env": env}, objects)
    code, log = exit_of(namespace, name)
    assert code == 1, log
    assert "cannot reach etcd at sie-etcd-elsewhere:2379" in log, log


def test_a_read_only_cache_directory_stops_the_worker_saying_what_to_mount(images, rendered, namespace_for) -> None:
    """A read-only root file system as the kubelet makes it (no tmpfs at /tmp: podman's --read-only had one, and hid
    that transformers needs a temporary directory as it is imported; the worker's pods now mount an emptyDir there),
    without the cache's volume."""
    objects = rendered["local"]
    workload, container = one_container(objects, "Deployment", "sie-worker")
    read_only = {
        **without_mount(container, "weights"),
        "securityContext": {**container["securityContext"], "readOnlyRootFilesystem": True},
    }
    namespace = namespace_for(objects)
    name = run_container(namespace, workload, read_only, objects)
    code, log = exit_of(namespace, name)
    assert code == 1, log
    assert "the local weight cache /var/cache/sie (SIE_LOCAL_CACHE) is not writable: Read-only file system" in log, log


def test_the_check_fails_a_manifest_naming_a_flag_a_variable_or_a_port_its_image_does_not_have(
    images, rendered, namespace_for
) -> None:
    objects = rendered["local"]
    _, config = one_container(objects, "Deployment", "sie-config")
    unknown = {**config, "env": [*config["env"], {"name": "SIE_NO_SUCH_SETTING", "value": "1"}]}
    assert unknown_variables(unknown) == ["SIE_NO_SUCH_SETTING"] and unknown_variables(config) == []
    workload, envoy = one_container(objects, "Deployment", "sie-envoy")
    namespace = namespace_for(objects)
    flag = {**envoy, "args": [*envoy["args"], "--no-such-flag"]}
    with pytest.raises(AssertionError, match="exited before its readinessProbe passed"):
        wait_ready(namespace, run_container(namespace, workload, flag, objects), flag)
    # No gateway in this namespace: Envoy's readiness (/readyz, which needs one) becomes "its listener is open", so
    # the liveness probe is not tried before Envoy listens.
    port = {
        **envoy,
        "readinessProbe": {"tcpSocket": {"port": "http"}},
        "ports": [*envoy["ports"], {"name": "bogus", "containerPort": 8099}],
    }
    with pytest.raises(AssertionError, match=r"port bogus \(8099\) does not listen"):
        wait_ready(namespace, run_container(namespace, workload, port, objects), port)


# -- what every container may do ------------------------------------------------------------------

SECRET_IN_ARGUMENTS = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_unprivileged_and_keeps_its_secrets_out_of_its_arguments(rendered, overlay: str) -> None:
    """Each container of each overlay, ours and the third-party ones alike (Envoy faces every client; etcd holds every
    credential): a numeric non-root user, no privilege escalation, no capabilities, the runtime's seccomp profile. And
    no variable from a Secret in its command or arguments: the kubelet expands `$(VAR)` there, and a process's
    arguments are readable by every user of its node (the demo-model Job once sent the admin token so)."""
    for workload in rendered[overlay]:
        if workload["kind"] not in ("Deployment", "StatefulSet", "Job"):
            continue
        spec = workload["spec"]["template"]["spec"]
        pod = spec.get("securityContext", {})
        for container in spec["containers"]:
            where = f"{overlay} {workload['metadata']['name']} {container['name']}"
            own = container.get("securityContext", {})
            assert own.get("runAsNonRoot", pod.get("runAsNonRoot")) is True, where
            assert own.get("allowPrivilegeEscalation") is False, where
            assert own.get("capabilities", {}).get("drop") == ["ALL"], where
            assert own.get("seccompProfile", pod.get("seccompProfile")) == {"type": "RuntimeDefault"}, where
            secret = {e["name"] for e in container.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
            named = {m for part in container.get("command", []) + container.get("args", [])
                     for m in SECRET_IN_ARGUMENTS.findall(part)}  # fmt: skip
            assert not secret & named, f"{where}: a Secret's value in the process's arguments: {sorted(secret & named)}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_gets_to_finish_its_drain_before_the_kubelet_kills_it(rendered, overlay: str) -> None:
    """terminationGracePeriodSeconds covers the service's own drain with room to spare: the gateway's equalled it (30 s
    each), so a drain that used its time was SIGKILLed before the gateway had closed its etcd mirror."""
    from sie_config.server import DRAIN_GRACE_S as CONFIG_DRAIN_S
    from sie_gateway.server import DRAIN_GRACE_S as GATEWAY_DRAIN_S
    from sie_worker.settings import WorkerSettings

    worker_drain_s = WorkerSettings.__dataclass_fields__["drain_timeout_s"].default
    for workload in rendered[overlay]:
        if workload["kind"] != "Deployment":
            continue
        spec = workload["spec"]["template"]["spec"]
        (container,) = spec["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        drain_s = {
            "sie-config": CONFIG_DRAIN_S,
            "sie-gateway": GATEWAY_DRAIN_S,
            "sie-worker-cpu": float(env.get("SIE_DRAIN_TIMEOUT_S") or worker_drain_s),
            "sie-worker-cuda": float(env.get("SIE_DRAIN_TIMEOUT_S") or worker_drain_s),
        }.get(container["image"].rsplit(":", 1)[0])
        if drain_s is not None:
            where = f"{overlay} {workload['metadata']['name']}"
            assert spec.get("terminationGracePeriodSeconds", 30) >= drain_s + 5, where
