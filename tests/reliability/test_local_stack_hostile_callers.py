"""The local stack and its HTTP edge as an adversary finds them (issue 20: 11, 14b-d, 15a-b), on real processes.

One `sie up --workers 2` serves the module, its services capped at 4 MiB a message
(SIE_MAX_SEND_MESSAGE_BYTES) so that an answer too large for one message is cheap to ask
for. Against it: a second stack and single servers on its ports (each must fail to
start, naming the port, while the first keeps serving), an Envoy beside another Envoy
on base id 0, unmatched routes and wrong methods, a ~6 MB JSON answer, answers refused
before any work, and, last, a worker killed with SIGKILL under load.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import grpc
import psutil
import pytest
from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import SIEClient
from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess
from worker_process import Services, free_port
from stack_process import SieUp
from test_stack_up import _two_free_ports

MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DIMS = 384
MESSAGE_LIMIT = 4 * 1024 * 1024
# How soon a killed worker must be registered and serving again (the supervisor restarts it after 0.5 s,
# from a standby process that has done its imports).
WORKER_BACK_S = 10.0


@dataclass
class RunningStack:
    process: subprocess.Popen
    state: Path
    output_path: Path
    ports: dict[str, int]
    metrics: dict[str, int]  # service -> metrics port, from the banner

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    @property
    def gateway(self) -> str:
        return f"127.0.0.1:{self.ports['gateway']}"

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def flags(self) -> list[str]:
        return stack_flags(self.ports)

    def worker_pid(self, index: int) -> int | None:
        """The process listening on worker-<index>'s port (a restarted worker may be the stack's standby)."""
        port = self.ports["worker"] + index
        for child in psutil.Process(self.process.pid).children():
            try:
                if any(
                    c.status == psutil.CONN_LISTEN and c.laddr.port == port
                    for c in child.net_connections("tcp")
                ):
                    return child.pid
            except psutil.Error:
                continue
        return None


def stack_flags(ports: dict[str, int]) -> list[str]:
    return [
        "--etcd-port",
        str(ports["etcd"]),
        "--config-port",
        str(ports["config"]),
        "--worker-port",
        str(ports["worker"]),
        "--gateway-port",
        str(ports["gateway"]),
        "--http-port",
        str(ports["http"]),
        "--envoy-admin-port",
        str(ports["admin"]),
    ]


def sie_up(
    state: Path, output: Path, flags: list[str], env: dict[str, str]
) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "sie_stack",
        "up",
        "--state-dir",
        str(state),
        "--workers",
        "2",
        *flags,
    ]
    with open(output, "w") as sink:
        return subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env},
        )


@pytest.fixture(scope="module")
def stack(services: Services, tmp_path_factory) -> RunningStack:
    tmp = tmp_path_factory.mktemp("adversarial-stack")
    ports = {
        name: free_port() for name in ("etcd", "config", "gateway", "http", "admin")
    }
    ports["worker"] = _two_free_ports()
    env = {"PYTHONUNBUFFERED": "1", "SIE_MAX_SEND_MESSAGE_BYTES": str(MESSAGE_LIMIT)}
    running = RunningStack(
        services.keep(SieUp(sie_up(tmp / "state", tmp / "stack.out", stack_flags(ports), env))).process,
        tmp / "state",
        tmp / "stack.out",
        ports,
        {},
    )
    deadline = time.monotonic() + 300
    while "Ctrl-C stops everything." not in running.output():
        assert running.process.poll() is None and time.monotonic() < deadline, (
            f"the stack did not come up:\n{running.output()}"
        )
        time.sleep(0.5)
    (metrics_line,) = [
        line
        for line in running.output().splitlines()
        if line.strip().startswith("metrics")
    ]
    running.metrics = {
        name: int(port)
        for name, port in re.findall(r"([\w-]+) :(\d+)", metrics_line)
    }
    return running


def http(
    method: str, url: str, body: object | None = None, timeout_s: float = 120
) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def error_reason(body: bytes) -> str:
    (info,) = [
        d
        for d in json.loads(body)["details"]
        if d["@type"].endswith("google.rpc.ErrorInfo")
    ]
    return info["reason"]


def assert_still_serves(stack: RunningStack) -> None:
    status, _, body = http(
        "POST",
        f"{stack.http}/v1/encode/{MODEL}",
        {"items": [{"text": "still serving"}]},
    )
    assert status == 200, body[:500]
    assert len(json.loads(body)["results"][0]["dense"]["values"]) == DIMS
    assert stack.process.poll() is None


def items(count: int) -> list[dict[str, str]]:
    return [{"text": f"item {i}"} for i in range(count)]


# -- 14c: a taken port fails start-up with a message; the first stack keeps serving -------


def test_a_second_stack_on_the_same_ports_fails_naming_them_and_the_first_keeps_serving(
    stack, tmp_path, reliability_report
) -> None:
    second = sie_up(
        tmp_path / "state",
        tmp_path / "second.out",
        stack.flags(),
        {"PYTHONUNBUFFERED": "1"},
    )
    try:
        code = second.wait(timeout=120)
    finally:
        if second.poll() is None:
            second.kill()
    output = (tmp_path / "second.out").read_text()
    reliability_report.add(
        "adversarial",
        "a second `sie up` on the same ports",
        expected="exit 1",
        actual=f"exit {code}",
    )
    assert code == 1, output
    p = stack.ports
    for named in (
        f"{p['etcd']} for etcd [--etcd-port / SIE_STACK_ETCD_PORT]",
        f"{p['worker'] + 1} for worker-1 [--worker-port / SIE_STACK_WORKER_PORT + 1]",
        f"{p['gateway']} for gateway [--gateway-port / SIE_STACK_GATEWAY_PORT]",
        f"{p['http']} for Envoy [--http-port / SIE_STACK_HTTP_PORT]",
    ):
        assert named in output, output
    assert "ports already in use on 127.0.0.1" in output and "Traceback" not in output
    assert_still_serves(stack)


@pytest.mark.parametrize("module", ["sie_worker", "sie_gateway", "sie_config"])
def test_a_server_on_a_taken_port_fails_start_naming_the_port(
    stack, tmp_path, module, reliability_report
) -> None:
    port = stack.ports[
        {"sie_worker": "worker", "sie_gateway": "gateway", "sie_config": "config"}[
            module
        ]
    ]
    models = tmp_path / "models"
    models.mkdir()
    env = {
        **os.environ,
        "SIE_HOST": "127.0.0.1",
        "SIE_PORT": str(port),
        "SIE_ETCD_ENDPOINTS": f"127.0.0.1:{stack.ports['etcd']}",
        "SIE_ETCD_PREFIX": f"/other-{uuid.uuid4().hex[:8]}/",
        # The stack's etcd wants its client certificate and a user; its root user may use any prefix.
        "SIE_ETCD_USERNAME": "root",
        "SIE_ETCD_PASSWORD_FILE": str(stack.state / "etcd-credentials" / "root"),
        "SIE_ETCD_CA_FILE": str(stack.state / "etcd-tls" / "ca.pem"),
        "SIE_ETCD_CERT_FILE": str(stack.state / "etcd-tls" / "client.pem"),
        "SIE_ETCD_KEY_FILE": str(stack.state / "etcd-tls" / "client-key.pem"),
        "SIE_MODELS_DIR": str(models),
        "SIE_PRELOAD_MODELS": "",
        "SIE_WORKER_METRICS_PORT": "0",
        "SIE_GATEWAY_METRICS_PORT": "0",
        "SIE_CONFIG_METRICS_PORT": "0",
    }
    code, stderr = _serve(module, env)
    reliability_report.add(
        "adversarial", f"{module} on a taken gRPC port", expected="exit 1", actual=code
    )
    assert code == 1, stderr
    assert (
        f"cannot listen on 127.0.0.1:{port}: the address is in use" in stderr
        and "grpc.so_reuseport=0" in stderr
    )
    assert "Traceback" not in stderr
    assert_still_serves(stack)


def test_a_taken_metrics_port_fails_start_naming_it(stack, tmp_path) -> None:
    env = {
        **os.environ,
        "SIE_HOST": "127.0.0.1",
        "SIE_PORT": str(free_port()),
        "SIE_MODELS_DIR": str(tmp_path),
        "SIE_WORKER_METRICS_PORT": str(stack.metrics["gateway"]),
    }
    code, stderr = _serve("sie_worker", env)
    assert code == 1, stderr
    assert (
        f"cannot serve metrics on 127.0.0.1:{stack.metrics['gateway']}: Address already in use"
        in stderr
    )
    assert "Traceback" not in stderr


def _serve(
    module: str, env: dict[str, str], timeout_s: float = 90
) -> tuple[int | str, str]:
    """Run `<module> serve` until it exits; one still running after `timeout_s` has bound the port: it is killed."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, "serve"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        return "still running (it shares the port)", output


# -- 14d: Envoy beside another Envoy on base id 0 --------------------------------------------


def test_envoy_starts_while_another_envoy_holds_base_id_0(
    stack, tmp_path, reliability_report
) -> None:
    other_admin = free_port()
    other_config = tmp_path / "other-envoy.json"
    other_config.write_text(
        json.dumps(
            {
                "admin": {
                    "address": {
                        "socket_address": {
                            "address": "127.0.0.1",
                            "port_value": other_admin,
                        }
                    }
                }
            }
        )
    )
    with open(tmp_path / "other-envoy.log", "wb") as log:
        other = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "envoy"),
                "-c",
                str(other_config),
                "--base-id",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ours = None
    try:
        _wait_ready(other_admin, other, tmp_path / "other-envoy.log")
        listen, admin = free_port(), free_port()
        config = tmp_path / "envoy.json"
        config.write_text(
            json.dumps(
                render(
                    listen_port=listen,
                    admin_port=admin,
                    gateway=stack.gateway,
                    config=f"127.0.0.1:{stack.ports['config']}",
                )
            )
        )
        ours = EnvoyProcess(config, tmp_path / "envoy.log", admin)
        ours.wait_ready(timeout_s=60)
        status, _, body = http("GET", f"http://127.0.0.1:{listen}/v1/models")
        reliability_report.add(
            "adversarial",
            "Envoy beside another Envoy on base id 0",
            expected=200,
            actual=status,
        )
        assert status == 200 and MODEL in {
            model["id"] for model in json.loads(body)["models"]
        }
        assert int(config.with_suffix(".base-id").read_text()) != 0
    finally:
        if ours is not None:
            ours.stop()
        other.terminate()
        other.wait(timeout=30)


def _wait_ready(
    admin_port: int, process: subprocess.Popen, log: Path, timeout_s: float = 60
) -> None:
    """Until the Envoy on base id 0 is ready, or has found base id 0 taken by an Envoy already running
    on this machine (the case under test either way)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            assert "unable to bind domain socket with base_id=0" in log.read_text(), (
                log.read_text()
            )
            return
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{admin_port}/ready", timeout=1
            ) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise TimeoutError("the first Envoy was not ready")


# -- 15a/15b: unmatched routes 404, wrong methods 405 -----------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/"),
        ("GET", "/v1/nothing"),
        ("POST", "/v2/encode/x"),
        ("GET", "/v1/modelz"),
        ("GET", "/sie.v1.Inference/Encode"),
    ],
)
def test_an_unmatched_route_answers_404_with_a_json_error(
    stack, method, path, reliability_report
) -> None:
    status, headers, body = http(
        method, stack.http + path, {} if method == "POST" else None
    )
    reliability_report.add(
        "adversarial", f"HTTP {method} {path} (no route)", expected=404, actual=status
    )
    assert status == 404, body[:300]
    assert headers["content-type"] == "application/json"
    assert json.loads(body)["code"] == 5 and error_reason(body) == "ROUTE_NOT_FOUND"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", f"/v1/encode/{MODEL}", "POST"),
        ("GET", f"/v1/score/{MODEL}", "POST"),
        ("PUT", "/v1/embeddings", "POST"),
        ("POST", "/v1/models", "GET"),
        ("DELETE", f"/v1/models/{MODEL}", "GET"),
        ("PUT", "/v1/pools/some-pool", "GET, DELETE"),
        ("DELETE", "/v1/configs/models", "POST, GET"),
    ],
)
def test_a_wrong_method_on_a_contract_path_answers_405(
    stack, method, path, allow, reliability_report
) -> None:
    status, headers, body = http(
        method, stack.http + path, {"items": items(1)} if method != "GET" else None
    )
    reliability_report.add(
        "adversarial",
        f"HTTP {method} {path} (wrong method)",
        expected=405,
        actual=status,
    )
    assert status == 405, body[:300]
    assert headers["allow"] == allow and headers["content-type"] == "application/json"
    assert (
        error_reason(body) == "METHOD_NOT_ALLOWED"
        and allow in json.loads(body)["message"]
    )
    assert_still_serves(stack)


# -- 11: large JSON answers: transcoded whole up to the message limit, refused before any work above it --


def test_a_6_mb_json_answer_comes_back_whole(stack, reliability_report) -> None:
    status, _, body = http(
        "POST", f"{stack.http}/v1/encode/{MODEL}", {"items": items(1600)}, timeout_s=300
    )
    reliability_report.add(
        "adversarial",
        "HTTP encode, 1600 items (a ~6 MB JSON answer)",
        expected=200,
        actual=status,
        json_bytes=len(body),
    )
    assert status == 200, body[:500]
    assert len(body) > 6_000_000
    results = json.loads(body)["results"]
    assert len(results) == 1600 and all(
        len(result["dense"]["values"]) == DIMS for result in results
    )


@pytest.mark.parametrize(
    ("path", "body", "size"),
    [
        # 3000 x 384 int8 values: 1.1 MiB packed, which fits, but JSON callers get every number as a
        # float, 4 bytes each in the message Envoy transcodes: 4.4 MiB.
        (
            f"/v1/encode/{MODEL}",
            {"items": items(3000), "output_dtype": "int8"},
            3000 * DIMS * 4,
        ),
        # 1000 x 384 numbers as JSON list values: 11 bytes each, 4.0 MiB (1.5 MiB as the worker's float32).
        (
            "/v1/embeddings",
            {"model": MODEL, "input": [f"text {i}" for i in range(1000)]},
            1000 * DIMS * 11,
        ),
    ],
    ids=["encode-int8", "embeddings"],
)
def test_an_answer_over_the_message_limit_once_spelled_out_is_refused_before_any_work(
    stack, path, body, size, reliability_report
) -> None:
    before = _worker_encodes(stack)
    status, _, answer = http("POST", stack.http + path, body)
    reliability_report.add(
        "adversarial",
        f"HTTP {path.split('/')[2]}, an answer over the message limit as JSON",
        expected=429,
        actual=status,
    )
    assert status == 429, answer[:500]
    assert error_reason(answer) == "RESPONSE_TOO_LARGE"
    message = json.loads(answer)["message"]
    assert (
        f"would take at least {size} bytes, more than the {MESSAGE_LIMIT} bytes"
        in message
    )
    assert "(SIE_MAX_SEND_MESSAGE_BYTES)" in message
    assert _worker_encodes(stack) == before  # no worker saw it
    assert_still_serves(stack)


def _worker_encodes(stack: RunningStack) -> float:
    """Encode requests the workers have counted, from their metrics."""
    total = 0.0
    for name in ("worker-0", "worker-1"):
        with urllib.request.urlopen(
            f"http://127.0.0.1:{stack.metrics[name]}/metrics", timeout=10
        ) as reply:
            text = reply.read().decode()
        total += sum(
            float(value)
            for value in re.findall(
                r'sie_worker_requests_total\{[^}]*operation="encode"[^}]*\} (\S+)', text
            )
        )
    return total


# -- 14b: a worker killed under load is restarted; no request fails ----------------------------


def test_a_worker_killed_under_load_is_restarted_and_no_request_fails(
    stack, reliability_report
) -> None:
    """Runs last: it kills a worker. Two callers keep encoding through the gateway (the SDK) meanwhile."""
    served: list[int] = [0, 0]
    failures: list[str] = []
    stop = threading.Event()

    def caller(index: int) -> None:
        with SIEClient(stack.gateway) as client:
            while not stop.is_set():
                try:
                    client.encode(MODEL, ["under load", f"caller {index}"])
                    served[index] += 1
                except Exception as error:  # noqa: BLE001 (every failure counts)
                    failures.append(repr(error)[:300])
                time.sleep(0.05)

    callers = [
        threading.Thread(target=caller, args=(i,), daemon=True) for i in range(2)
    ]
    for thread in callers:
        thread.start()
    try:
        ready = (
            stack.state / "worker-standby.ready"
        )  # the stack's standby worker has done its imports
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
        served_before_kill = sum(served)
        killed = stack.worker_pid(1)
        assert killed is not None
        os.kill(killed, signal.SIGKILL)
        back_after_s = _wait_served_by(stack, 1, killed, since=time.monotonic())
        served_while_down = sum(served) - served_before_kill
        time.sleep(1)  # a little load after the restart too
    finally:
        stop.set()
        for thread in callers:
            thread.join(timeout=70)
    reliability_report.add(
        "adversarial",
        "sie up --workers 2, kill -9 of a worker under load",
        requests=sum(served),
        served_while_down=served_while_down,
        failed=len(failures),
        worker_back_s=None if back_after_s is None else round(back_after_s, 1),
    )
    assert failures == [], failures[:3]
    assert served_while_down > 0  # the stack kept serving while worker-1 was down
    assert back_after_s is not None and back_after_s <= WORKER_BACK_S, (
        f"worker-1 was back after {back_after_s} s, not within {WORKER_BACK_S} s:\n{stack.output()[-2000:]}"
    )
    assert (
        "worker-1 exited unexpectedly (code -9); restarting it in 0.5 s"
        in stack.output()
    )
    assert stack.process.poll() is None  # the stack kept running


def _wait_served_by(
    stack: RunningStack, index: int, killed: int, since: float, timeout_s: float = 60
) -> float | None:
    """Seconds from `since` until a new worker-<index> process is registered with the model and answers
    requests through the gateway; None if that did not happen within `timeout_s`."""
    worker_id = f"worker-{index}"
    with grpc.insecure_channel(stack.gateway) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        while time.monotonic() < since + timeout_s:
            pid = stack.worker_pid(index)
            if pid is not None and pid != killed:
                try:
                    model = stub.GetModel(
                        inference_pb2.GetModelRequest(model=MODEL), timeout=5
                    ).model
                    # Calls in flight together spread over the workers (the gateway picks the least busy).
                    request = inference_pb2.EncodeRequest(
                        model=MODEL, items=[types_pb2.Item(text="are you back?")]
                    )
                    calls = [stub.Encode.future(request, timeout=5) for _ in range(4)]
                    answered_by = {
                        dict(call.trailing_metadata())["x-sie-worker"]
                        for call in calls
                        if call.result()
                    }
                    if worker_id in model.loaded_on and worker_id in answered_by:
                        return time.monotonic() - since
                except grpc.RpcError:
                    pass
            time.sleep(0.1)
    return None


@pytest.mark.process
def test_a_process_that_keeps_exiting_is_restarted_with_doubling_delays(
    tmp_path, caplog
) -> None:
    """The supervisor's backoff on a real process that exits at once (3), on a clock the test moves."""
    from sie_stack.processes import ChildProcess
    from sie_stack.supervisor import Supervisor

    crasher = ChildProcess(tmp_path / "crasher.log")
    crasher._spawn([sys.executable, "-c", "raise SystemExit(3)"])
    now = [0.0]
    supervisor = Supervisor([crasher], clock=lambda: now[0])
    delays = []
    for _ in range(8):
        crasher.process.wait(timeout=30)
        supervisor.check()  # notes the exit
        delay = float(re.findall(r"restarting it in ([\d.]+) s", caplog.text)[-1])
        delays.append(delay)
        now[0] += delay - 0.01
        supervisor.check()
        assert crasher.process.poll() == 3  # not restarted before its delay
        now[0] += 0.01
        supervisor.check()  # restarted
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    crasher.process.wait(timeout=30)
    assert "crasher exited unexpectedly (code 3)" in caplog.text
