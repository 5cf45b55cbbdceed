"""The HTTP port beside each service's gRPC port: /metrics, /healthz and /readyz.

/metrics is the Prometheus text format of prometheus_client's default
registry (every module registers its metrics there); /healthz answers 200
while the process runs; /readyz answers 200 only when `ready()` says so (the
same state as grpc.health.v1), else 503. One thread of its own serves the
port, so a scrape never waits for the service's event loop.

The port has no authentication, so what a connection may cost is bounded
(docs/security.md, Bounds). That thread reads every connection's request head
as it arrives (no thread per connection: 2,000 idle connections once held
2,000 threads), at most REQUEST_HEAD_BYTES within REQUEST_HEAD_S of the
connection (http.server alone took 100 headers of 64 KB each and waited for
them for ever: 100 trickling connections grew a gateway by 3 GB). Each head
is parsed by http.server's request handler and answered at once; the answer
is sent as the client takes it, within ANSWER_S.

At most MAX_CONNECTIONS connections are open at once. Past that a new
connection closes the one that has waited longest for its own request head:
clients that sent half a head and reconnected when dropped used to keep every
scrape and probe out (0 of 112 scrapes answered), where a probe, which sends
its whole head at once, is now read within a turn of the loop and answered.
A connection whose request has arrived is never closed for another while it
takes its answer; one that has taken none of it for ANSWER_STALL_S may be,
when no connection is still sending its head (else clients that send a whole
request for /metrics and never read the answer would hold the places
instead). When no connection may be closed, the new one is. Each connection
closed so is counted (sie_metrics_port_connections_dropped_total) and logged
at WARNING, at most once per DROP_LOG_EVERY_S.
"""

from __future__ import annotations

import contextlib
import io
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from sie_common.runtime.metric_labels import ClosedSet, counter

log = logging.getLogger(__name__)

# Histogram buckets (seconds) of every latency metric, from a millisecond to a minute.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Connections open at once (each holds a socket and at most REQUEST_HEAD_BYTES of head, or its answer).
MAX_CONNECTIONS = 64
# A request's line and headers: at most this many bytes, all within this many seconds of its connection.
REQUEST_HEAD_BYTES = 8192
REQUEST_HEAD_S = 10.0
# An answer must be taken within this many seconds; one the client has taken nothing of for ANSWER_STALL_S may be
# closed for a new connection.
ANSWER_S = 10.0
ANSWER_STALL_S = 2.0
# Connections accepted per turn of the loop, between reads of the heads that have arrived (a head that came with
# its connection is read before MAX_CONNECTIONS newer connections could close it).
ACCEPTS_PER_TURN = 16
# A pause after an accept that failed (no file descriptor left) before the next.
ACCEPT_RETRY_S = 0.05
# Connections closed for others are logged at most this often (with how many since the last line).
DROP_LOG_EVERY_S = 60.0

# Why a connection was closed for another: "evicted" (it was the longest still sending its head, or its answer had
# stalled) or "refused" (it was new, and every open connection was being answered).
DROPPED = counter(
    "sie_metrics_port_connections_dropped",
    "Connections to the metrics port closed because MAX_CONNECTIONS were open: evicted (the one waiting longest for "
    "its request head, or whose answer had stalled, for a new connection) or refused (a new one, on accept)",
    {"why": ClosedSet(("evicted", "refused"))},
)


class MetricsServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool]) -> None:
        self.ready = ready
        family = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        # "::" takes IPv4 too where the system can (as "0.0.0.0" does for IPv4 alone).
        dualstack = family == socket.AF_INET6 and host == "::" and socket.has_dualstack_ipv6()
        self._listener = socket.create_server((host, port), family=family, backlog=64, dualstack_ipv6=dualstack)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._wake_in, self._wake_out = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_in, selectors.EVENT_READ)
        self._connections: dict[socket.socket, _Connection] = {}  # in the order they were accepted
        self._stopping = False
        self._drops = _DropLog()
        self._thread = threading.Thread(target=self._serve, name="sie-metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_out.send(b"x")
        self._thread.join(5)
        for connection in list(self._connections.values()):
            self._close(connection)
        self._selector.close()
        for sock in (self._listener, self._wake_in, self._wake_out):
            sock.close()

    def _serve(self) -> None:
        while not self._stopping:
            now = time.monotonic()
            soonest = min((connection.deadline for connection in self._connections.values()), default=now + 1.0)
            accept = False
            for key, _ in self._selector.select(max(0.0, soonest - now)):
                if key.fileobj is self._listener:
                    accept = True
                elif key.fileobj is self._wake_in:
                    with contextlib.suppress(OSError):
                        self._wake_in.recv(64)
                elif key.data.answer is None:
                    self._read_head(key.data)
                else:
                    self._send(key.data)
            if accept:
                self._accept()
            self._close_expired(time.monotonic())

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                sock, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:  # out of file descriptors, or the client gave up in the backlog
                log.debug("metrics port: accept failed: %s", error)
                time.sleep(ACCEPT_RETRY_S)  # the connection waits in the backlog: do not spin on it
                return
            if len(self._connections) >= MAX_CONNECTIONS and not self._evict_one():
                self._drops.dropped("refused", peer)
                sock.close()
                continue
            sock.setblocking(False)
            connection = _Connection(sock, peer, time.monotonic() + REQUEST_HEAD_S)
            self._connections[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _evict_one(self) -> bool:
        """Close the connection waiting longest for its head, else the one whose answer has stalled longest (if for
        ANSWER_STALL_S): False if there is none."""
        heads = (connection for connection in self._connections.values() if connection.answer is None)
        victim = next(heads, None)
        if victim is None:
            stalled = [c for c in self._connections.values() if time.monotonic() - c.progress_at >= ANSWER_STALL_S]
            victim = min(stalled, key=lambda connection: connection.progress_at, default=None)
        if victim is None:
            return False
        self._drops.dropped("evicted", victim.peer)
        self._close(victim)
        return True

    def _read_head(self, connection: _Connection) -> None:
        try:
            data = connection.sock.recv(REQUEST_HEAD_BYTES - len(connection.head))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client has gone
            self._close(connection)
            return
        searched_to = max(0, len(connection.head) - 3)
        connection.head += data
        end = _head_end(connection.head, searched_to)
        if end is None:
            if len(connection.head) >= REQUEST_HEAD_BYTES:
                log.debug("metrics port: a request head from %s exceeds %d bytes", connection.peer, REQUEST_HEAD_BYTES)
                self._close(connection)
            return
        try:
            answer = _Request.answer(bytes(connection.head[:end]), connection.peer, self)
        except Exception:  # a failing collector or ready() answers 500; the port serves on
            log.exception("metrics port: answering a request from %s failed", connection.peer)
            answer = b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"
        connection.answer = memoryview(answer)
        connection.head.clear()
        connection.progress_at = time.monotonic()
        connection.deadline = connection.progress_at + ANSWER_S
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._send(connection)

    def _send(self, connection: _Connection) -> None:
        assert connection.answer is not None
        try:
            sent = connection.sock.send(connection.answer)
        except BlockingIOError:
            return
        except OSError:
            self._close(connection)
            return
        if sent:
            connection.answer = connection.answer[sent:]
            connection.progress_at = time.monotonic()
        if not connection.answer:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_WR)
            self._close(connection)

    def _close_expired(self, now: float) -> None:
        for connection in [c for c in self._connections.values() if now >= c.deadline]:
            what = "its request head" if connection.answer is None else "its answer taken"
            log.debug("metrics port: closing a connection from %s: %s not in time", connection.peer, what)
            self._close(connection)

    def _close(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(connection.sock)
        connection.sock.close()


def start_metrics_server(host: str, port: int, ready: Callable[[], bool]) -> MetricsServer | None:
    """Serve on host:port, or nothing when `port` is 0; OSError when the port is taken."""
    if port == 0:
        return None
    try:
        server = MetricsServer(host, port, ready).start()
    except OSError as error:
        raise OSError(
            f"cannot serve metrics on {host}:{port}: {error.strerror or error}; set another metrics port, or 0 to "
            f"turn it off"
        ) from None
    log.info("metrics, /healthz and /readyz on http://%s:%d", host, server.port)
    return server


@dataclass
class _Connection:
    sock: socket.socket
    peer: Any
    # When it is closed unless its head has arrived (REQUEST_HEAD_S) or its answer has been taken (ANSWER_S).
    deadline: float
    head: bytearray = field(default_factory=bytearray)
    # What is left to send of the answer, once the head has arrived.
    answer: memoryview | None = None
    # When the client last took some of its answer.
    progress_at: float = 0.0


def _head_end(head: bytearray, start: int) -> int | None:
    """Where the request head ends (after its blank line, CRLF or LF), searching from `start`; None before it has."""
    ends = [(found, len(blank)) for blank in (b"\r\n\r\n", b"\n\n") if (found := head.find(blank, start)) >= 0]
    if not ends:
        return None
    found, length = min(ends)
    return found + length


class _DropLog:
    """Counts connections closed for others, and says so at WARNING at most once per DROP_LOG_EVERY_S."""

    def __init__(self) -> None:
        self._since_line = 0
        self._next_line_at = 0.0

    def dropped(self, why: str, peer: Any) -> None:
        DROPPED.labels(why).inc()
        self._since_line += 1
        now = time.monotonic()
        if now < self._next_line_at:
            return
        log.warning(
            "metrics port: %d connection(s) closed since the last such line because %d were open at once (the last "
            "%s, from %s); clients that open many and send their requests slowly would keep probes out "
            "(sie_metrics_port_connections_dropped_total)",
            self._since_line,
            MAX_CONNECTIONS,
            why,
            peer,
        )
        self._since_line = 0
        self._next_line_at = now + DROP_LOG_EVERY_S


class _Request(BaseHTTPRequestHandler):
    """http.server's parsing and answers, over a request head already read whole; the answer is written to a buffer
    (the server sends it as the client takes it)."""

    def __init__(self, head: bytes, peer: Any, server: MetricsServer) -> None:  # no super(): it would serve a socket
        self.rfile = io.BytesIO(head)
        self.written = self.wfile = io.BytesIO()
        self.client_address = peer
        self.metrics = server
        self.close_connection = True

    @classmethod
    def answer(cls, head: bytes, peer: Any, server: MetricsServer) -> bytes:
        request = cls(head, peer, server)
        request.handle_one_request()
        return request.written.getvalue()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._answer(200, b"ok\n")
        elif path == "/readyz":
            ready = self.metrics.ready()
            self._answer(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
        else:
            self._answer(404, b"not found: try /metrics, /healthz or /readyz\n")

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes are not worth a log line each
        pass
