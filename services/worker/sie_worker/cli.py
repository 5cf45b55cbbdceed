"""`sie-worker serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Coroutine, MutableMapping
from typing import Any

from sie_common.runtime.service_cli import serve_main
from sie_worker.settings import WorkerSettings


def idle_openmp_threads_sleep(environ: MutableMapping[str, str]) -> None:
    """Unless the operator chose how idle OpenMP threads wait (OMP_WAIT_POLICY, GOMP_SPINCOUNT), they sleep at once
    (PASSIVE): libgomp, torch's OpenMP, reads this when torch loads, so it must be set before.

    By default an idle libgomp thread spins some 300,000 rounds (milliseconds) after each parallel region. A forward
    pass is a hundred regions; where other processes share the cores, the spinning takes the core from the thread
    the region waits for and from the event loop: on the 2-core development machine under load, a one-item
    all-MiniLM-L6-v2 pass on two torch threads took 190-350 ms spinning and 11-32 ms passive, and a one-thread pass
    beside a two-thread one 24 ms against 9 (docs/benchmarks.md)."""
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _load_serve() -> Callable[[WorkerSettings], Coroutine[Any, Any, None]]:
    idle_openmp_threads_sleep(os.environ)
    from sie_worker.server import serve  # heavy imports (torch) after argument errors

    # The imported modules' objects live as long as the process: out of the collector's reach, the collection at
    # exit does not walk them (a worker's stop took seconds of it after its drain).
    gc.freeze()
    return serve


def main(argv: list[str] | None = None) -> int:
    return serve_main(
        argv,
        prog="sie-worker",
        description="The SIE worker: batches and runs search models.",
        serve_help="serve sie.v1.Inference (standalone mode)",
        settings_type=WorkerSettings,
        load_serve=_load_serve,
    )


if __name__ == "__main__":
    sys.exit(main())
