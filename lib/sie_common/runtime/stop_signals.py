"""SIGTERM and SIGINT outside a service's serving event loop's own handlers (which serve installs first; the worker
uses these).

Before them, the worker spends seconds importing torch and the model code; after them (the loop closed, its
handlers gone), the interpreter tears down for a few hundred ms (threads joined, finalizers run). A signal in the
first window killed the process mid-import (SIGTERM's default: exit -15; SIGINT: a KeyboardInterrupt traceback), and
a second one in the last (SIGTERM then SIGINT, or two Ctrl-C) turned a clean stop into exit -15 or a traceback.
Now one that comes while importing is remembered and the start stops at once (exit 0, nothing registered), and
once the stop is done, further ones are ignored.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []


def remember_until_serving() -> None:
    """From now until serve installs its handlers, a stop signal is remembered instead of ending the process."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda signum, _frame: _received.append(signum))


def received_before_serving() -> bool:
    return bool(_received)


def ignore_once_stopped() -> None:
    """The service has stopped (drained, deregistered): the interpreter's teardown is not cut short."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
