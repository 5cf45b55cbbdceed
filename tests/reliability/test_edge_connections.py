"""Idle connections cannot keep callers off the HTTP edge. Envoy closes connections past `--max-connections` on
accept, and an idle connection used to keep its place for the 300 s idle timeout: 1,100 TCP connections that never
sent a byte (no token, no request) made every new caller's connection fail for 5 minutes, renewable at will (issue
32, attack round 3). Now idle timeouts shrink from half the limit on, to 2 s at 90%. Envoy alone, with a limit of 64
so the test stays small; a caller's /healthz (Envoy answers it itself) must get through."""

from __future__ import annotations

import socket
import time

import pytest
from edge_load import held_connections, request, running_edge

# Starts processes (its Envoy) in fixtures of its own.
pytestmark = pytest.mark.process

LIMIT = 64
KEPT_AT_MOST = LIMIT * 6 // 10  # of the idle connections, once timeouts shrank


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


def test_idle_connections_at_the_limit_do_not_keep_callers_out(edge, reliability_report) -> None:
    with held_connections(edge.port, LIMIT + 16) as idle:
        # The overload manager sees the count every 0.25 s and idle timeouts are 2 s at 90%: about 2.5 s on a quiet
        # machine; up to 12 s on a busy one (a clean-clone run had 52 still open at 4 s) before calling it kept.
        # The shrinking stops near half the limit (the timers stretch back as the count falls towards it), so up to
        # 60% may stay: what matters is that new callers get in.
        deadline = time.monotonic() + 12
        while (left := still_open(idle)) > KEPT_AT_MOST and time.monotonic() < deadline:
            time.sleep(0.5)
        answers = []
        for _ in range(5):
            try:
                answers.append(request(edge.port, "GET", "/healthz")[0])
            except OSError:
                answers.append(0)
            time.sleep(0.2)
    reliability_report.add("edge", f"{LIMIT + 16} idle connections, limit {LIMIT}", still_open=left, healthz=answers)
    assert left <= KEPT_AT_MOST, f"{left} idle connections still open after 12 s"
    assert answers.count(200) >= 4, answers
