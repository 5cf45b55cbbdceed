"""The metrics port (/metrics, /healthz, /readyz of every service) keeps answering scrapes and probes while clients
crowd it. Before, it served 16 connections at once, shared by everyone, and closed any more on accept: more than 16
clients that sent half a request head and reconnected when dropped kept every scrape and probe out (0 of 112 scrapes
answered, issue 32), and said so only at DEBUG. Now a new connection closes the one that has waited longest for its
own head; a probe, which sends its head at once, is answered; a connection whose request has arrived is never closed
for another; each closing is counted and logged at WARNING, rate-limited. Served in-process, as every service serves
it, against clients on an event loop of their own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from foreign_servers import metrics_port
from sie_common.runtime.metrics_server import MAX_CONNECTIONS

HALF_HEAD = b"GET /metrics HTTP/1.1\r\nhost: x\r\n"  # no blank line: the head never ends


@pytest.fixture
def port() -> Iterator[int]:
    with metrics_port() as serving:
        yield serving


@contextlib.contextmanager
def reconnecting_half_heads(port: int, clients: int, host: str = "127.0.0.1") -> Iterator[list[int]]:
    """`clients` connections that each send half a head, wait until the server closes them, and reconnect at once,
    for as long as the block lasts (on a loop and thread of their own); yields [connections made]."""
    made = [0]
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(host, port)
                made[0] += 1
                writer.write(HALF_HEAD)
                await writer.drain()
                closed = asyncio.ensure_future(reader.read(1))
                await asyncio.wait([closed, asyncio.ensure_future(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
                closed.cancel()
                writer.close()
            except OSError:
                await asyncio.sleep(0.001)

    async def crowd() -> None:
        await asyncio.gather(*(client() for _ in range(clients)))

    thread = threading.Thread(target=loop.run_until_complete, args=(crowd(),), daemon=True)
    thread.start()
    try:
        yield made
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        loop.close()


def get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, bytes, float]:
    """(status, body, seconds) of GET `path`."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as reply:
        return reply.status, reply.read(), time.monotonic() - started


def dropped(why: str) -> float:
    return REGISTRY.get_sample_value("sie_metrics_port_connections_dropped_total", {"why": why}) or 0.0


def test_scrapes_and_probes_answer_while_clients_reconnect_with_half_heads(port, caplog, reliability_report) -> None:
    evicted_before = dropped("evicted")
    with caplog.at_level(logging.WARNING), reconnecting_half_heads(port, 2 * MAX_CONNECTIONS) as made:
        deadline = time.monotonic() + 10
        while made[0] < 4 * MAX_CONNECTIONS and time.monotonic() < deadline:  # the crowd is churning
            time.sleep(0.05)
        answers = [get(port, path) for path in ("/healthz", "/metrics", "/readyz") * 10]
        churned = made[0]
    statuses = [status for status, _, _ in answers]
    slowest = max(seconds for _, _, seconds in answers)
    reliability_report.add(
        "metrics port", "128 clients reconnecting with half heads", answered=statuses.count(200), slowest_s=slowest
    )
    assert churned >= 4 * MAX_CONNECTIONS, f"only {churned} connections made: the crowd never filled the port"
    assert statuses == [200] * len(answers), statuses
    assert slowest < 5, f"a probe took {slowest:.1f} s"
    assert b"sie_metrics_port_connections_dropped_total" in answers[1][1]
    assert dropped("evicted") - evicted_before >= churned - 2 * MAX_CONNECTIONS
    warnings = [r for r in caplog.records if r.name.endswith("metrics_server") and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # thousands closed, one line: rate-limited
    assert "closed since the last such line" in warnings[0].getMessage()


def test_a_head_that_completes_as_a_newcomer_comes_is_answered(port) -> None:
    """The oldest connection of a full port finishes its head just before a newcomer comes, which would close the
    oldest still sending its head: it is answered, and so is the newcomer."""
    for _ in range(5):
        with contextlib.ExitStack() as connections:
            oldest = connections.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            oldest.sendall(b"GET /healthz HTTP/1.1\r\n")
            time.sleep(0.05)
            for _ in range(MAX_CONNECTIONS - 1):
                connections.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5)).sendall(HALF_HEAD)
            time.sleep(0.2)  # all read: the port is full, `oldest` first in line to be closed
            oldest.sendall(b"host: x\r\n\r\n")
            newcomer = get(port, "/healthz")
            answer = oldest.recv(4096)
        assert answer.startswith(b"HTTP/1.0 200"), answer
        assert newcomer[0] == 200
        time.sleep(0.2)  # the crowd's connections closed


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_the_port_serves_ipv6_and_stays_answerable_there() -> None:
    """SIE_HOST may be an IPv6 address: http.server's server took IPv4 only (`::1` failed to bind)."""
    with metrics_port("::1") as port, reconnecting_half_heads(port, 2 * MAX_CONNECTIONS, host="::1") as made:
        deadline = time.monotonic() + 10
        while made[0] < 4 * MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.05)
        statuses = [get(port, "/healthz", host="[::1]")[0] for _ in range(10)]
    assert statuses == [200] * 10


def test_a_header_flood_within_the_head_bound_is_answered(port) -> None:
    """Many small headers that fit REQUEST_HEAD_BYTES are parsed (http.server's own limit is 100 headers)."""
    headers = b"".join(b"x-%d: v\r\n" % n for n in range(90))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\n" + headers + b"\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.0 200")
    too_many = b"".join(b"x-%d: v\r\n" % n for n in range(120))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
        client.sendall(b"GET /healthz HTTP/1.1\r\n" + too_many + b"\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.0 431")
    assert get(port, "/healthz")[0] == 200


def test_running_out_of_file_descriptors_does_not_spin_the_port(port) -> None:
    """accept() failing (EMFILE) leaves the connection in the backlog, so the listener stays readable: the port's
    thread used 0.54 s of CPU in 2 s retrying it at once; it pauses between tries, and serves once descriptors free."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[socket.socket] = []
    client = None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
        with contextlib.suppress(OSError):
            while True:
                held.append(socket.socket())
        held.pop().close()  # one for the client: the server's accept has none left
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        cpu_before = time.process_time()
        time.sleep(2)
        cpu = time.process_time() - cpu_before
    finally:
        for sock in held:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert client is not None
    with client:
        client.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.0 200")
    assert cpu < 0.2, f"{cpu:.2f} s of CPU in 2 s while accept failed"
