"""Servers a client or a scraper may meet that are not what it expects, or that serve only part of SIE, started in
process for a test's `with` block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from sie_common.runtime.metrics_server import MetricsServer


@contextlib.contextmanager
def health_only_server() -> Iterator[str]:
    """A real gRPC server that serves grpc.health.v1 and nothing else: what a client meets at a wrong port."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


@contextlib.contextmanager
def metrics_port(host: str = "127.0.0.1") -> Iterator[int]:
    """A service's metrics port (/metrics, /healthz, /readyz), always ready, as every service serves it."""
    server = MetricsServer(host, 0, lambda: True).start()
    try:
        yield server.port
    finally:
        server.stop()
