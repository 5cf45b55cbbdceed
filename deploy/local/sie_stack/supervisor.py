"""Keep the processes of a local stack running: one that exits is started again, with backoff.

The delay before a restart doubles with each exit in a row (0.5 s, 1 s, 2 s, ... up to 30 s) and
starts over once the process has run for a minute, so a crash loop does not spin while a single
crash (a killed worker) is repaired at once. Meanwhile the rest of the stack keeps serving: the
gateway sends a lost worker's requests to the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sie_stack.processes import ChildProcess

log = logging.getLogger("sie_stack")


@dataclass
class _Watched:
    process: ChildProcess
    started_at: float
    exits_in_a_row: int = 0
    # Set while the process is down, waiting for its restart.
    restart_at: float | None = None


class Supervisor:
    def __init__(
        self,
        processes: Sequence[ChildProcess],
        *,
        first_delay_s: float = 0.5,
        max_delay_s: float = 30.0,
        stable_after_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self._first_delay_s = first_delay_s
        self._max_delay_s = max_delay_s
        self._stable_after_s = stable_after_s
        self._watched = [_Watched(process, clock()) for process in processes]

    def check(self) -> None:
        """Note the processes that exited and restart those whose delay has passed; call it often."""
        now = self._clock()
        for watched in self._watched:
            if watched.restart_at is None:
                self._note_exit(watched, now)
            elif now >= watched.restart_at:
                watched.process.respawn()
                watched.restart_at, watched.started_at = None, now
                log.warning(
                    "%s restarted (pid %s)",
                    _label(watched.process),
                    watched.process.pid,
                )

    def _note_exit(self, watched: _Watched, now: float) -> None:
        code = watched.process.exit_code()
        if code is None:
            if now - watched.started_at >= self._stable_after_s:
                watched.exits_in_a_row = 0
            return
        delay = min(self._max_delay_s, self._first_delay_s * 2**watched.exits_in_a_row)
        watched.exits_in_a_row += 1
        watched.restart_at = now + delay
        log.error(
            "%s exited unexpectedly (code %s); restarting it in %.1f s (exit %d in a row). Its log: %s",
            _label(watched.process),
            code,
            delay,
            watched.exits_in_a_row,
            watched.process.log_path,
        )


def _label(process: ChildProcess) -> str:
    """worker-0, sie_gateway, etcd, envoy: the name of its log."""
    return process.log_path.stem
