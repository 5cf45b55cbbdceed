"""The HTTP port beside each service's gRPC port: /metrics, /healthz and /readyz.

/metrics is the Prometheus text format of prometheus_client's default
registry (every module registers its metrics there); /healthz answers 200
while the process runs; /readyz answers 200 only when `ready()` says so (the
same state as grpc.health.v1), else 503. The server runs in its own thread,
so a scrape never waits for the event loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger(__name__)

# Histogram buckets (seconds) of every latency metric, from a millisecond to a minute.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MetricsServer:
    def __init__(self, host: str, port: int, ready: Callable[[], bool]) -> None:
        handler = type("_Handler", (_Handler,), {"ready": staticmethod(ready)})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
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


class _Handler(BaseHTTPRequestHandler):
    ready: Callable[[], bool]

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
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # scrapes are not worth a log line each
        pass
