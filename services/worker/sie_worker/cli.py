"""`sie-worker serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from sie_common.runtime.service_cli import serve_main
from sie_worker.settings import WorkerSettings


def _load_serve() -> Callable[[WorkerSettings], Coroutine[Any, Any, None]]:
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
