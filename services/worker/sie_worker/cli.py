"""`sie-worker serve`: flags override the SIE_* environment variables."""

from __future__ import annotations

import gc
import os
import re
import sys
from collections.abc import Callable, Coroutine, MutableMapping
from typing import Any

from sie_common.runtime.service_cli import serve_main
from sie_common.runtime.settings import SettingsError
from sie_common.runtime.stop_signals import ignore_once_stopped, remember_until_serving
from sie_worker.settings import WorkerSettings

# How libgomp reads the variables that say how its idle threads wait (GCC's libgomp/env.c): a value it cannot parse
# is reported on stderr and ignored, and its threads then spin, the default the worker sets PASSIVE to avoid.
# Spaces as C's isspace() has them around either; letters compared as strncasecmp does, byte by byte (re.ASCII: a
# Unicode case fold would take PASSIVE spelled with U+017F, the long s, or 10 with U+212A, the Kelvin sign, both of
# which libgomp ignores).
_C_SPACE = "[ \t\n\v\f\r]*"
OPENMP_WAIT_VALUES = {
    # name: (what libgomp reads, said in words)
    "OMP_WAIT_POLICY": (
        re.compile(f"{_C_SPACE}(active|passive){_C_SPACE}", re.IGNORECASE | re.ASCII),
        "ACTIVE or PASSIVE (any case)",
    ),
    # strtoull's integer (a sign allowed, below 2**64), optionally scaled by k, M, G or T.
    "GOMP_SPINCOUNT": (
        re.compile(
            f"{_C_SPACE}(infinite|infinity|(?P<count>[+-]?[0-9]+){_C_SPACE}[kmgt]?){_C_SPACE}", re.IGNORECASE | re.ASCII
        ),
        "a count of spins (e.g. 0, 10000, 10k) or INFINITE",
    ),
}


def idle_openmp_threads_sleep(environ: MutableMapping[str, str]) -> None:
    """Unless the operator chose how idle OpenMP threads wait (OMP_WAIT_POLICY, GOMP_SPINCOUNT), they sleep at once
    (PASSIVE): libgomp, torch's OpenMP, reads this when torch loads, so it must be set before. A choice libgomp would
    not read (empty, a typo) raises SettingsError saying what it reads: libgomp would ignore it and spin.

    By default an idle libgomp thread spins some 300,000 rounds (milliseconds) after each parallel region. A forward
    pass is a hundred regions; where other processes share the cores, the spinning takes the core from the thread
    the region waits for and from the event loop: on the 2-core development machine under load, a one-item
    all-MiniLM-L6-v2 pass on two torch threads took 190-350 ms spinning and 11-32 ms passive, and a one-thread pass
    beside a two-thread one 24 ms against 9 (docs/benchmarks.md)."""
    for name, (pattern, words) in OPENMP_WAIT_VALUES.items():
        if name in environ and not _openmp_reads(pattern, environ[name]):
            raise SettingsError(
                f"{name}={environ[name][:40]!r}: libgomp would ignore it and let idle threads spin; set {words}, "
                "or unset it (the worker then sets OMP_WAIT_POLICY=PASSIVE)"
            )
    if "OMP_WAIT_POLICY" not in environ and "GOMP_SPINCOUNT" not in environ:
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _openmp_reads(pattern: re.Pattern[str], value: str) -> bool:
    matched = pattern.fullmatch(value)
    if matched is None:
        return False
    count = matched.groupdict().get("count")
    return count is None or abs(int(count)) < 2**64  # strtoull's range (a minus sign negates modulo 2**64)


def _load_serve() -> Callable[[WorkerSettings], Coroutine[Any, Any, None]]:
    remember_until_serving()  # a signal while torch imports: serve stops at once (exit 0) instead of exit -15
    try:
        idle_openmp_threads_sleep(os.environ)
    except SettingsError as error:  # refused as a SIE_* setting is: before anything loads, exit 2
        print(f"sie-worker: error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    from sie_worker.server import serve  # heavy imports (torch) after argument errors

    # The imported modules' objects live as long as the process: out of the collector's reach, the collection at
    # exit does not walk them (a worker's stop took seconds of it after its drain).
    gc.freeze()
    return serve


def main(argv: list[str] | None = None) -> int:
    code = serve_main(
        argv,
        prog="sie-worker",
        description="The SIE worker: batches and runs search models.",
        serve_help="serve sie.v1.Inference (standalone mode)",
        settings_type=WorkerSettings,
        load_serve=_load_serve,
    )
    ignore_once_stopped()
    return code


if __name__ == "__main__":
    sys.exit(main())
