"""The metrics port (/metrics, /healthz, /readyz of every service) has no authentication: what a connection to it may
cost is bounded. Before, http.server gave every connection a thread that waited for its headers for ever and took
100 headers of 64 KB each: 2,000 idle connections held 2,000 threads of a gateway, and 100 connections trickling big
headers grew it from 61 MB to 3.1 GB (issue 32, attack round 3). Served in-process, as every service serves it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from edge_load import held_connections

from foreign_servers import metrics_port

# The bounds the port keeps (sie_common.runtime.metrics_server; literals, so this test runs against code without them).
MAX_CONNECTIONS = 16
REQUEST_HEAD_BYTES = 8192
REQUEST_HEAD_S = 10.0


@pytest.fixture
def port() -> Iterator[int]:
    with metrics_port() as serving:
        yield serving


def closed_by_server(sender: socket.socket, within_s: float) -> bool:
    sender.settimeout(within_s)
    try:
        return sender.recv(65536) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def healthz(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        return reply.status


def test_idle_connections_hold_a_bounded_number_of_threads_and_not_for_ever(port, reliability_report) -> None:
    threads_before = threading.active_count()
    with held_connections(port, 100, b"GET /metrics HTTP/1.1\r\nhost: x\r\n") as idle:  # headers that never end
        time.sleep(1)
        threads = threading.active_count() - threads_before
        started = time.monotonic()
        dropped = sum(closed_by_server(sender, REQUEST_HEAD_S + 5 - (time.monotonic() - started)) for sender in idle)
        seconds = time.monotonic() - started
    reliability_report.add(
        "metrics port", "100 idle connections", threads=threads, dropped=dropped, seconds=round(seconds, 1)
    )
    assert threads <= MAX_CONNECTIONS + 1, f"{threads} threads for 100 idle connections"
    assert dropped == len(idle) == 100, f"{dropped} of {len(idle)} idle connections closed in {REQUEST_HEAD_S + 5} s"
    assert healthz(port) == 200


def test_a_head_over_its_bound_is_refused_without_reading_it_all(port) -> None:
    """99 headers of 60 KB (6 MB) were read and parsed whole: now the connection closes past REQUEST_HEAD_BYTES."""
    header = b"x-big: " + b"v" * 60_000 + b"\r\n"
    with held_connections(port, 1, b"GET /metrics HTTP/1.1\r\n") as (sender,):
        with contextlib.suppress(OSError):  # the server closed the connection: that is what is asserted
            for _ in range(99):
                sender.sendall(header)
        assert closed_by_server(sender, 5)
    assert healthz(port) == 200


def test_a_scrape_still_answers_after_the_attackers_leave(port) -> None:
    with held_connections(port, 30):
        time.sleep(0.5)
    deadline = time.monotonic() + 5
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
                assert reply.status == 200 and b"python_info" in reply.read()
            return
        except OSError:
            assert time.monotonic() < deadline, "the metrics port did not serve again after its attackers left"
            time.sleep(0.2)
