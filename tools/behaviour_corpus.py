"""The behaviour corpus: the same requests (tools/corpus_requests.py) sent to a standalone worker over gRPC and to a
`sie up` stack over gRPC (the gateway) and HTTP (Envoy), every answer and refusal recorded, so that two trees can
be compared: answers byte for byte (timings left out), refusals by status code, reason, message and metadata.

    python tools/behaviour_corpus.py build DIR           # the tiny models and their configs, once
    python tools/behaviour_corpus.py record DIR OUT      # the corpus against the tree this Python imports
    python tools/behaviour_corpus.py compare A B         # what differs between two recordings

To record another tree (a refactor's base, say), put its packages first on PYTHONPATH; `paths TREE` prints them:

    git worktree add /tmp/base <commit>
    PYTHONPATH=$(python tools/behaviour_corpus.py paths /tmp/base) python tools/behaviour_corpus.py record DIR base.json

Every worker computes in float32 with fixed batch limits (SIE_ADAPTIVE_BATCHING=false) and the corpus sends one
request at a time, so a forward pass holds the same items on every run; the bounds are lowered (BOUNDS) so that
the refusals past them are cheap to reach.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

sys.path.insert(0, str(Path(__file__).parent))

from corpus_models import MINILM, build
from corpus_requests import Case, corpus
from sie.v1 import config_pb2, config_pb2_grpc, inference_pb2, inference_pb2_grpc, worker_pb2_grpc
from sie_common.cluster.config_messages import config_to_message
from sie_common.cluster.model_config import parse_model_config
from sie_stack.processes import ServiceProcess, free_port

# Lowered bounds (both the worker and the gateway read them), so that each refusal past one is one small request.
BOUNDS = {
    "SIE_MAX_ITEMS_PER_REQUEST": "64",
    "SIE_MAX_TEXT_BYTES": "4096",
    "SIE_MAX_INSTRUCTION_BYTES": "1024",
    "SIE_MAX_OPTIONS_BYTES": "4096",
    "SIE_MAX_LABELS": "16",
    "SIE_MAX_IMAGE_PIXELS": "100000",
    "SIE_MAX_REQUEST_IMAGE_PIXELS": "150000",
    "SIE_MAX_SCORE_MULTIVECTOR_BYTES": "100000",
}
DETERMINISTIC = {"SIE_CPU_COMPUTE_PRECISION": "float32", "SIE_ADAPTIVE_BATCHING": "false", "SIE_LOG_LEVEL": "WARNING"}
ADMIN_TOKEN = "behaviour-corpus"
LOADING = ("MODEL_LOADING", "LORA_LOADING")
# The packages of a tree, for PYTHONPATH.
PACKAGE_DIRS = (
    "contract/python",
    "lib",
    "clients/python",
    "services/worker",
    "services/gateway",
    "services/config",
    "deploy/local",
    "tools",
)
Record = dict[str, Any]


# --- what is recorded ---------------------------------------------------------------------------------------------


def _untimed(message: Message) -> Message:
    """A copy without timings (and the timings of the answers it carries), which change from run to run."""
    copy = type(message)()
    copy.CopyFrom(message)
    pending = [copy]
    while pending:
        current = pending.pop()
        for field, value in current.ListFields():
            if field.name == "timing":
                current.ClearField("timing")
            elif field.message_type is not None and not field.is_repeated:
                pending.append(value)
    return copy


def _answer(message: Message) -> Record:
    return {"answer": base64.b64encode(_untimed(message).SerializeToString(deterministic=True)).decode()}


def _status(status: status_pb2.Status) -> Record:
    """A refusal: code, message, and its ErrorInfo reason and metadata."""
    code = next(code.name for code in grpc.StatusCode if code.value[0] == status.code)
    record: Record = {"code": code, "message": status.message}
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            record |= {"reason": info.reason, "metadata": dict(sorted(info.metadata.items()))}
    return record


def _refusal(error: grpc.RpcError) -> Record:
    trailers: Any = error.trailing_metadata() or ()
    for key, value in trailers:
        if key == "grpc-status-details-bin":
            return _status(status_pb2.Status.FromString(value))
    return {"code": error.code().name, "message": error.details()}


# --- transports -----------------------------------------------------------------------------------------------------


def grpc_call(channel: grpc.Channel, case: Case) -> Record:
    """The case over gRPC: an Inference method, or the Worker's Work stream (answers sorted by request_id)."""
    try:
        if case.method == "Work":
            answers = worker_pb2_grpc.WorkerStub(channel).Work(iter(case.request), timeout=120)
            return {"stream": sorted((_work(answer) for answer in answers), key=lambda r: r["request_id"])}
        stub = inference_pb2_grpc.InferenceStub(channel)
        if case.method == "EncodeStream":
            answers = stub.EncodeStream(iter(case.request), timeout=120)
            return {"stream": sorted((_stream(answer) for answer in answers), key=lambda r: r["request_id"])}
        return _answer(getattr(stub, case.method)(case.request, timeout=120))
    except grpc.RpcError as error:
        return _refusal(error)


def _work(answer: Any) -> Record:
    outcome = answer.WhichOneof("outcome")
    body = _status(answer.error) if outcome == "error" else _answer(getattr(answer, outcome))
    return {"request_id": answer.request_id, "worker_id": answer.worker_id, **body}


def _stream(answer: inference_pb2.EncodeStreamResponse) -> Record:
    body = _status(answer.error) if answer.HasField("error") else _answer(answer.response)
    return {"request_id": answer.request_id, **body}


def http_call(url: str, case: Case) -> Record:
    """The case as HTTP/JSON through Envoy (the path names the model); the JSON answer without timings."""
    body = json_format.MessageToDict(case.request, preserving_proto_field_name=True)
    if case.method == "CreateEmbeddings":
        path = "/v1/embeddings"
    else:
        path = f"/v1/{case.method.lower()}/{body.pop('model', '')}"
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST")
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            status, text = reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read().decode()
    try:
        parsed: Any = json.loads(text)
    except json.JSONDecodeError:
        parsed = text
    if isinstance(parsed, dict):
        parsed.pop("timing", None)
    return {"http": status, "body": parsed}


# --- runs -----------------------------------------------------------------------------------------------------------


def run_cases(call: Callable[[Case], Record], cases: list[Case]) -> dict[str, Record]:
    """Each case once, after a first pass that waits out model and LoRA loads (a loading answer is not recorded)."""
    for _ in range(60):
        loading = [case for case in cases if _is_loading(call(case))]
        if not loading:
            break
        cases_left = {case.name for case in loading}
        print(f"  waiting for loads: {', '.join(sorted(cases_left))[:200]}", flush=True)
        time.sleep(2)
    return {case.name: call(case) for case in cases}


def _is_loading(record: Record) -> bool:
    records = record.get("stream", [record])
    bodies = [r.get("body") for r in records if isinstance(r.get("body"), dict)]
    reasons = [r.get("reason") for r in records] + [
        detail.get("reason") for body in bodies for detail in body.get("details", []) if isinstance(detail, dict)
    ]
    return any(reason in LOADING for reason in reasons)


def record_worker(directory: Path, cases: list[Case]) -> dict[str, Record]:
    built = json.loads((directory / "built.json").read_text())
    env = {
        **DETERMINISTIC,
        **BOUNDS,
        "SIE_MODELS_DIR": str(directory / "configs"),
        "SIE_WEIGHT_ROOTS": str(directory),
        "SIE_PRELOAD_MODELS": ",".join([*built, MINILM]),
        "SIE_WORKER_ID": "corpus-worker",
    }
    (directory / "logs").mkdir(exist_ok=True)
    worker = ServiceProcess(env, directory / "logs" / f"worker-{os.getpid()}.log")
    try:
        worker.wait_serving(timeout_s=900)
        with grpc.insecure_channel(worker.address) as channel:
            return run_cases(lambda case: grpc_call(channel, case), cases)
    finally:
        worker.stop()


@contextmanager
def stack(directory: Path) -> Iterator[tuple[str, str]]:
    """`sie up` with one worker, the corpus models added through its config service: (gateway address, HTTP URL)."""
    ports = {name: free_port() for name in ("etcd", "config", "worker", "gateway", "http", "envoy-admin")}
    state = directory / "stacks" / str(os.getpid())
    command = [sys.executable, "-m", "sie_stack", "up", "--state-dir", str(state), "--workers", "1"]
    for name, port in ports.items():
        command += [f"--{name}-port", str(port)]
    env = {**os.environ, **DETERMINISTIC, **BOUNDS, "SIE_ADMIN_TOKEN": ADMIN_TOKEN, "SIE_WEIGHT_ROOTS": str(directory)}
    log = state.parent / f"{os.getpid()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for(lambda: "Ctrl-C stops everything." in log.read_text() or process.poll() is not None, 600)
        if process.poll() is not None:
            raise RuntimeError(f"sie up stopped: see {log}")
        configs = [yaml.safe_load(path.read_text()) for path in sorted((directory / "configs").glob("*.yaml"))]
        with grpc.insecure_channel(f"127.0.0.1:{ports['config']}") as channel:
            admin = config_pb2_grpc.ConfigServiceStub(channel)
            for config in configs:
                message = config_to_message(parse_model_config(config, source=config["id"]))
                admin.AddModel(
                    config_pb2.AddModelRequest(config=message),
                    metadata=(("authorization", f"Bearer {ADMIN_TOKEN}"),),
                    timeout=30,
                )
        gateway = f"127.0.0.1:{ports['gateway']}"
        with grpc.insecure_channel(gateway) as channel:
            listed = inference_pb2_grpc.InferenceStub(channel).ListModels
            wanted = {config["id"] for config in configs}
            _wait_for(
                lambda: wanted <= {m.id for m in listed(inference_pb2.ListModelsRequest(), timeout=5).models}, 120
            )
        yield gateway, f"http://127.0.0.1:{ports['http']}"
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    import signal

    import psutil  # type: ignore[import-untyped]

    children = psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
    for child in children:
        if child.is_running():
            child.kill()


def _wait_for(done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not done within {timeout_s} s")
        time.sleep(1)


def record(directory: Path, out: Path, only: str | None) -> None:
    cases = corpus()
    recorded: dict[str, dict[str, Record]] = {}
    if only in (None, "worker"):
        print(f"worker: {len(cases)} cases", flush=True)
        recorded["worker-grpc"] = record_worker(directory, cases)
    if only in (None, "stack"):
        unary = [case for case in cases if case.method != "Work"]
        with stack(directory) as (gateway, url):
            with grpc.insecure_channel(gateway) as channel:
                print(f"stack gRPC: {len(unary)} cases", flush=True)
                recorded["stack-grpc"] = run_cases(lambda case: grpc_call(channel, case), unary)
            http = [case for case in unary if case.http]
            print(f"stack HTTP: {len(http)} cases", flush=True)
            recorded["stack-http"] = run_cases(lambda case: http_call(url, case), http)
    out.write_text(json.dumps(recorded, indent=1, sort_keys=True))
    print(f"recorded {sum(map(len, recorded.values()))} answers in {out}")


# What differs from run to run and is left out of a comparison: heap addresses in messages (Pillow names its
# BytesIO), worker ids (a standalone worker's is its host and port).
RUN_DEPENDENT = (
    (re.compile(r"0x[0-9a-f]{6,}"), "0x…"),
    (re.compile(r'"worker_id": "[^"]*"'), '"worker_id": "…"'),
    (re.compile(r"on worker [^;]*;"), "on worker …;"),
)


def _comparable(recorded: dict[str, dict[str, Record]]) -> dict[str, dict[str, Record]]:
    text = json.dumps(recorded, sort_keys=True)
    for pattern, replacement in RUN_DEPENDENT:
        text = pattern.sub(replacement, text)
    return json.loads(text)


def compare(first: Path, second: Path) -> int:
    """Print what differs; 1 if anything does."""
    a, b = _comparable(json.loads(first.read_text())), _comparable(json.loads(second.read_text()))
    differences = 0
    counts = {"answers": 0, "refusals": 0}
    for transport in sorted(set(a) | set(b)):
        left, right = a.get(transport, {}), b.get(transport, {})
        for name in sorted(set(left) | set(right)):
            one, other = left.get(name), right.get(name)
            kind = "refusals" if one and ("code" in one or one.get("http", 200) != 200) else "answers"
            counts[kind] += 1
            if one != other:
                differences += 1
                print(f"DIFFERS {transport} {name}:\n  {json.dumps(one)[:600]}\n  {json.dumps(other)[:600]}")
    total = sum(counts.values())
    print(f"{total} recorded calls ({counts['answers']} answers, {counts['refusals']} refusals); {differences} differ")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build").add_argument("directory", type=Path)
    recording = commands.add_parser("record")
    recording.add_argument("directory", type=Path)
    recording.add_argument("out", type=Path)
    recording.add_argument("--only", choices=("worker", "stack"))
    comparing = commands.add_parser("compare")
    comparing.add_argument("first", type=Path)
    comparing.add_argument("second", type=Path)
    commands.add_parser("paths").add_argument("tree", type=Path)
    args = parser.parse_args()
    if args.command == "build":
        print("built:", ", ".join(build(args.directory)))
    elif args.command == "record":
        record(args.directory.resolve(), args.out, args.only)
    elif args.command == "compare":
        return compare(args.first, args.second)
    else:
        print(os.pathsep.join(str(args.tree.resolve() / folder) for folder in PACKAGE_DIRS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
