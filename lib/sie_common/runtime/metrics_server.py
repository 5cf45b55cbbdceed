"""The HTTP port beside each service's gRPC port: /metrics, /healthz and /readyz.

/metrics is the Prometheus text format of prometheus_client's default
registry (every module registers its metrics there); /healthz answers 200
while the process runs; /readyz answers 200 only when `ready()` says so (the
same state as grpc.health.v1), else 503. The server runs in its own threads,
so a scrape never waits for the event loop.

The port has no authentication, so what one connection may cost is bounded
(docs/security.md, Bounds): each connection gets a thread, at most
MAX_CONNECTIONS at once (more are closed on accept); a request's line and
headers must arrive within REQUEST_HEAD_BYTES and REQUEST_HEAD_S of its
connection (http.server alone takes 100 headers of 64 KB each, and waits for
them for ever: 100 connections trickling such headers grew a gateway by
3 GB, and idle ones held a thread each until they closed); a client that goes
away or breaks a bound costs one debug line, not a traceback on stderr.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)

# Histogram buckets (seconds) of every latency metric, from a millisecond to a minute.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Connections served at once (a thread each); Prometheus and the kubelet's probes need a few.
MAX_CONNECTIONS = 16
# A request's line and headers: at most this many bytes, all within this many seconds of its connection.
REQUEST_HEAD_BYTES = 8192
REQUEST_HEAD_S = 10.0


class MetricsServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool]) -> None:
        handler = type("_Handler", (_Handler,), {"ready": staticmethod(ready)})
        self._server = _BoundedServer((host, port), handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="sie-metrics-http", daemon=True)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


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


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most MAX_CONNECTIONS of them; a connection past that is closed on accept."""

    daemon_threads = True
    request_queue_size = 64  # connections waiting to be accepted (and served, or closed when over the bound)

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            log.debug(
                "metrics port: %d connections at once already; closing one from %s", MAX_CONNECTIONS, client_address
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics port: a request from %s ended early", client_address, exc_info=True)


class _HeadTooLarge(Exception):
    pass


class _BoundedHead:
    """The connection's reader for the request's line and headers: REQUEST_HEAD_BYTES in all, read within
    REQUEST_HEAD_S of the connection (a recv past the deadline times out, a longer head raises)."""

    def __init__(self, raw: Any, connection: socket.socket) -> None:
        self._raw = raw
        self._connection = connection
        self._left = REQUEST_HEAD_BYTES
        self._deadline = time.monotonic() + REQUEST_HEAD_S

    def readline(self, size: int = -1) -> bytes:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"the request's headers did not arrive within {REQUEST_HEAD_S:.0f} s")
        if self._left <= 0:
            raise _HeadTooLarge(f"the request's headers exceed {REQUEST_HEAD_BYTES} bytes")
        self._connection.settimeout(remaining)
        line = self._raw.readline(self._left if size < 0 else min(size, self._left))
        self._left -= len(line)
        return bytes(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Handler(BaseHTTPRequestHandler):
    ready: Callable[[], bool]
    # Each socket operation (the answer's writes too) gives up after this long.
    timeout = REQUEST_HEAD_S

    def setup(self) -> None:
        super().setup()
        self.rfile = _BoundedHead(self.rfile, self.connection)  # type: ignore[assignment]

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            self._answer(200, b"ok\n")
        elif path == "/readyz":
            ready = self.ready()
            self._answer(200 if ready else 503, b"ready\n" if ready else b"not ready\n")
        else:
            self._answer(404, b"not found: try /metrics, /healthz or /readyz\n")

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.connection.settimeout(self.timeout)  # the head's deadline is not the answer's
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes are not worth a log line each
        pass
