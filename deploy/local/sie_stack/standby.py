"""`python -m sie_stack.standby sie_worker READY_FILE`: a worker process that has done its imports and waits.

Most of a worker's start is importing torch and transformers (seconds, many more on a busy machine).
`sie up` keeps one such process waiting, so a crashed worker comes back in about the time its model
takes to load. It creates READY_FILE once its imports are done. The supervisor writes one JSON line
on its stdin: the environment and the log file of the worker it replaces, and its command line. It
takes them and serves exactly as `python -m sie_worker serve` would.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path


def main(module: str, ready_path: str) -> int:
    cli = importlib.import_module(f"{module}.cli")
    # The heavy part, done before it is needed.
    importlib.import_module(f"{module}.server")
    Path(ready_path).touch()
    order = sys.stdin.readline()
    if not order:  # the stack went away without needing it
        return 0
    instance = json.loads(order)
    os.environ.clear()
    os.environ.update(instance["env"])
    log = os.open(instance["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, sys.stdout.fileno())
    os.dup2(log, sys.stderr.fileno())
    return cli.main(instance["argv"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
