"""Idle connections cannot keep callers off the HTTP edge. Envoy closes connections past `--max-connections` on
accept, and an idle connection used to keep its place for the 300 s idle timeout: 1,100 TCP connections that never
sent a byte (no token, no request) made every new caller's connection fail for 5 minutes, renewable at will (issue
32, attack round 3). Now, from CROWDED_SHARE (90%) of the limit on, every connection idle for 2 s is closed until
fewer are open, so a tenth of the limit is free for new callers, and stays so however often the idle connections are
opened again, at once or one by one. Envoy alone, with a limit of 64 so the test stays small; a caller's /healthz
(Envoy answers it itself) must get through.

What is asserted holds whatever the machine's load: the count falls below the threshold (the overload manager looks
every 0.25 s and closes nothing while the count is below it, so the only question is when, bounded generously), and
callers then get in. (Scaled from half the limit, as it was, the timeouts stretched back as the count fell, so how
many stayed depended on timing: 47 of 64 in a busy CI run, against a bound of 38; connections opened one by one, as
on a busy machine, left 54 to 56 open every time.)"""

from __future__ import annotations

import contextlib
import math
import socket
import time
from collections.abc import Iterator

import pytest
from edge_load import held_connections, request, running_edge

from sie_stack.envoy_config import CROWDED_SHARE

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

LIMIT = 64
# Idle connections left once shedding stops: fewer than CROWDED_SHARE of the limit (57 of 64).
KEPT_AT_MOST = math.ceil(LIMIT * CROWDED_SHARE) - 1
# Not a timing goal: the 2 s idle timeout plus the overload manager's 0.25 s look, on a machine busy enough to delay
# both many times over. The loop ends as soon as the count is below the threshold.
SHED_WITHIN_S = 30


@pytest.fixture(scope="module")
def edge(tmp_path_factory):
    with running_edge(tmp_path_factory.mktemp("connections"), max_connections=LIMIT) as running:
        yield running


def still_open(sockets: list[socket.socket]) -> int:
    count = 0
    for sender in sockets:
        sender.setblocking(False)
        try:
            count += sender.recv(1) != b""
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


@contextlib.contextmanager
def opened_one_by_one(port: int, count: int, gap_s: float = 0.05) -> Iterator[list[socket.socket]]:
    """`count` idle connections opened `gap_s` apart (their idle timers end as far apart)."""
    sockets = []
    try:
        for _ in range(count):
            with contextlib.suppress(OSError):
                sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(gap_s)
        yield sockets
    finally:
        for sender in sockets:
            sender.close()


def shed(idle: list[socket.socket]) -> tuple[int, float]:
    """(idle connections still open, seconds) once fewer than the threshold are open, or at SHED_WITHIN_S."""
    started = time.monotonic()
    while (left := still_open(idle)) > KEPT_AT_MOST and time.monotonic() - started < SHED_WITHIN_S:
        time.sleep(0.25)
    return left, time.monotonic() - started


def healthz(port: int, tries: int = 5) -> list[int]:
    answers = []
    for _ in range(tries):
        try:
            answers.append(request(port, "GET", "/healthz")[0])
        except OSError:
            answers.append(0)
        time.sleep(0.2)
    return answers


def test_idle_connections_at_the_limit_do_not_keep_callers_out(edge, reliability_report) -> None:
    with held_connections(edge.port, LIMIT + 16) as idle:
        left, seconds = shed(idle)
        answers = healthz(edge.port)
        # The attacker opens as many again, one by one: the limit fills, and is shed again.
        with opened_one_by_one(edge.port, LIMIT) as again:
            left_again, seconds_again = shed(idle + again)
            answers_again = healthz(edge.port)
    reliability_report.add(
        "edge", f"{LIMIT + 16} idle connections, limit {LIMIT}, then {LIMIT} more", still_open=[left, left_again],
        seconds=[round(seconds, 1), round(seconds_again, 1)], healthz=answers + answers_again,
    )  # fmt: skip
    assert left <= KEPT_AT_MOST, f"{left} of {LIMIT} idle connections still open after {seconds:.1f} s"
    assert left_again <= KEPT_AT_MOST, f"{left_again} idle connections still open after {seconds_again:.1f} s"
    # A caller's connection gets in and is answered (one may land in the instant the limit refills).
    assert answers.count(200) >= 4, answers
    assert answers_again.count(200) >= 4, answers_again
