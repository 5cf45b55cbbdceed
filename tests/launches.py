"""The processes the tests started, counted by kind and printed at the end of the run ("processes started"): the
services (workers, gateways, config services, `sie up`, etcd, Envoy, the S3 server) apart from the tools (curl,
grpcurl, buf, kustomize, ...).

Each test process (every pytest-xdist worker) counts what its tests start; the workers' counts are merged into the
controller's. A `sie up` counts as one: the services it starts are its children, not the suite's. The services
forked from the suite's zygote (tools/service_zygote.py) instead of spawned are counted apart too.
Set SIE_TEST_LAUNCH_LOG to a file to have every launch appended to it (a JSON line: the test and the command).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

# `python -m <module>` -> the kind it is counted as.
MODULES = {
    "sie_worker": "worker",
    "sie_gateway": "gateway",
    "sie_config": "config service",
    "sie_stack": "sie up",
    "sie_stack.standby": "standby",
}


SERVICES = frozenset({*MODULES.values(), "etcd", "envoy", "moto_server"})


def kind(argv: list[str]) -> str:
    if argv and Path(argv[0]).name.startswith("python") and "-m" in argv[:-1]:
        module = argv[argv.index("-m") + 1]
        return MODULES.get(module, f"python -m {module}")
    return Path(argv[0]).name if argv else "?"


class LaunchCount:
    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.forked = 0
        self._log = os.environ.get("SIE_TEST_LAUNCH_LOG")

    def add(self, argv: list[str], test: str, forked: bool = False) -> None:
        self.kinds[kind(argv)] += 1
        self.forked += forked
        if self._log:
            with open(self._log, "a") as log:
                log.write(json.dumps({"test": test, "argv": argv[:6], "forked": forked}) + "\n")

    def dumps(self) -> str:
        return json.dumps({"kinds": self.kinds, "forked": self.forked})

    def merge(self, dumped: str) -> None:
        counts = json.loads(dumped)
        self.kinds.update(counts.get("kinds", {}))
        self.forked += counts.get("forked", 0)

    def summarize(self, terminal: pytest.TerminalReporter) -> None:
        if not self.kinds:
            return
        parts = []
        for label, kinds in (
            ("services", [(name, n) for name, n in self.kinds.most_common() if name in SERVICES]),
            ("tools", [(name, n) for name, n in self.kinds.most_common() if name not in SERVICES]),
        ):
            if kinds:
                counts = ", ".join(f"{name} {count}" for name, count in kinds)
                parts.append(f"{sum(count for _, count in kinds)} {label} ({counts})")
        forked = f" ({self.forked} of the services forked from a zygote)" if self.forked else ""
        terminal.write_line(f"processes started by the tests: {'; '.join(parts)}{forked}")
