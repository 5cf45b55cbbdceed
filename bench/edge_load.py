"""The HTTP edge under hostile load: Envoy (with the config `sie up` renders) on its own, the check's time per MB of
the worst bodies, and Envoy's memory while many slow senders hold half-sent bodies.

    python bench/edge_load.py            # both tables (about a minute on 2 cores)

The tests (tests/reliability/test_edge_*.py) use the same pieces with generous bounds.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import socket
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from sie_stack.envoy_config import render
from sie_stack.processes import EnvoyProcess, free_port

MB = 2**20
ITEM = '{"items":[{"text":"x"}],'


@dataclass
class Edge:
    """An Envoy on loopback: its HTTP port, its admin port and its process."""

    port: int
    admin_port: int
    envoy: EnvoyProcess

    def rss_bytes(self) -> int:
        assert self.envoy.process is not None
        return int(psutil.Process(self.envoy.process.pid).memory_info().rss)

    def heap_bytes(self) -> int:
        """What tcmalloc holds for Envoy (admin /memory: heap_size less what it has given back)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/memory", timeout=5) as reply:
            memory = json.loads(reply.read())
        return int(memory["heap_size"]) - int(memory["pageheap_unmapped"])


@contextlib.contextmanager
def running_edge(tmp: Path, gateway: str | None = None, config: str | None = None, **options: int) -> Iterator[Edge]:
    """Envoy with the rendered config (`options` go to render()); without `gateway` it fronts a port nobody serves."""
    port, admin_port = free_port(), free_port()
    nowhere = f"127.0.0.1:{free_port()}"
    config_path = tmp / "envoy.json"
    rendered = render(
        listen_port=port, admin_port=admin_port, gateway=gateway or nowhere, config=config or nowhere, **options
    )
    config_path.write_text(json.dumps(rendered))
    envoy = EnvoyProcess(config_path, tmp / "envoy.log", admin_port)
    try:
        envoy.wait_ready()
        yield Edge(port, admin_port, envoy)
    finally:
        envoy.stop()


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    source: str = "127.0.0.1",
) -> tuple[int, float, bytes]:
    """(status, seconds, body) of one request on a fresh connection from `source` (the path sent as it is)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120, source_address=(source, 0))
    try:
        started = time.perf_counter()
        connection.request(method, path, body, {"content-type": "application/json", **(headers or {})})
        reply = connection.getresponse()
        data = reply.read()
        return reply.status, time.perf_counter() - started, data
    finally:
        connection.close()


# Bodies of about `size` bytes that cost the request check (and the transcoder behind it) the most per byte.
WORST_BODIES: dict[str, Callable[[int], str]] = {
    "one long text": lambda size: '{"items":[{"text":"' + "a" * size + '"}]}',
    "escapes": lambda size: '{"items":[{"text":"' + "\\n" * (size // 2) + '"}]}',
    "small items": lambda size: '{"items":[' + ",".join(['{"text":"x"}'] * (size // 13)) + "]}",
    "numbers in options": lambda size: ITEM + '"options":{"a":[' + ",".join(["0"] * (size // 2)) + "]}}",
    "keys in options": lambda size: ITEM + '"options":{' + ",".join(f'"k{i}":1' for i in range(size // 12)) + "}}",
    "nested arrays": lambda size: ITEM + '"options":{"a":[' + ",".join(["[[[[[[0]]]]]]"] * (size // 14)) + "]}}",
    "digits": lambda size: ITEM + '"dims":' + "1" * size + "}",
    "spaces": lambda size: '{"items":[{"text":"x"}]' + " " * size + "}",
}


def check_times(port: int, size: int) -> dict[str, tuple[int, float]]:
    """(status, seconds) of each worst body of `size` bytes with one byte more that breaks it at its very end: the
    check reads all of it and refuses it, so nothing behind Envoy is involved."""
    return {
        name: request(port, "POST", "/v1/encode/m", (make(size) + "x").encode())[:2]
        for name, make in WORST_BODIES.items()
    }


@contextlib.contextmanager
def held_connections(port: int, count: int, first_bytes: bytes = b"") -> Iterator[list[socket.socket]]:
    """`count` connections to `port` that each send `first_bytes` (or nothing) and then hold still until the block
    ends; one the server refuses or closes at once is left out."""
    sockets = []
    try:
        for _ in range(count):
            with contextlib.suppress(OSError):
                sender = socket.create_connection(("127.0.0.1", port), timeout=5)
                sockets.append(sender)
                if first_bytes:
                    sender.sendall(first_bytes)
        yield sockets
    finally:
        for sender in sockets:
            sender.close()


def peers(count: int) -> list[str]:
    """`count` loopback addresses besides 127.0.0.1 (all of 127/8 is loopback on Linux): clients Envoy tells apart."""
    return [f"127.0.{1 + n // 250}.{1 + n % 250}" for n in range(count)]


@contextlib.contextmanager
def slow_senders(
    port: int, count: int, body_bytes: int, sent_bytes: int, chunk: int = MB, sources: Sequence[str] = ("127.0.0.1",)
) -> Iterator[list[socket.socket]]:
    """`count` connections (from `sources` in turn) that each announce a `body_bytes` encode body and send
    `sent_bytes` of it, `chunk` at a time over every connection in turn, then stop sending (but stay open) until the
    block ends. The bytes differ between senders and between a sender's chunks (its random text turned by a few bytes
    each time): Lua keeps one copy of equal strings, so equal bodies would cost Envoy's request check one body's
    memory."""
    head = (
        f"POST /v1/encode/m HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\n"
        f"content-length: {body_bytes}\r\n\r\n"
    ).encode()
    start = b'{"items":[{"text":"'
    sockets, texts = [], []
    try:
        for n in range(count):
            sender = socket.create_connection(("127.0.0.1", port), source_address=(sources[n % len(sources)], 0))
            sender.settimeout(1)
            sender.sendall(head + start)
            sockets.append(sender)
            texts.append(os.urandom(chunk // 2).hex().encode())
        for offset in range(len(start), sent_bytes, chunk):
            size = min(chunk, sent_bytes - offset)
            turn = offset // chunk * 4099 % chunk
            for sender, text in zip(sockets, texts, strict=True):
                with contextlib.suppress(OSError):  # Envoy may have reset it: that is what is measured
                    sender.sendall((text[turn:] + text[:turn])[:size])
        yield sockets
    finally:
        for sender in sockets:
            sender.close()


def answered(sockets: list[socket.socket]) -> list[str]:
    """The status line each slow sender got (or "" for none yet, "reset" for a reset connection)."""
    lines = []
    for sender in sockets:
        try:
            sender.settimeout(0.01)
            lines.append(sender.recv(200).split(b"\r\n", 1)[0].decode(errors="replace"))
        except TimeoutError:
            lines.append("")
        except OSError:
            lines.append("reset")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=8, help="size of each worst body")
    parser.add_argument("--senders", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_edge(Path(tmp)) as edge:
        size = int(args.size_mb * MB)
        print(f"| body ({args.size_mb:g} MB, refused at its last byte) | status | ms | ms per MB |")
        print("| --- | --- | --- | --- |")
        for name, (status, seconds) in check_times(edge.port, size).items():
            print(f"| {name} | {status} | {seconds * 1000:.0f} | {seconds * 1000 / args.size_mb:.1f} |")
        print()
        for label, sources in ((f"{args.senders} addresses", peers(args.senders)), ("one address", ["127.0.0.1"])):
            idle_rss, idle_heap = edge.rss_bytes(), edge.heap_bytes()
            peak_rss = peak_heap = 0
            with slow_senders(edge.port, args.senders, 16 * MB, 15 * MB, sources=sources) as sockets:
                for _ in range(20):
                    peak_rss, peak_heap = max(peak_rss, edge.rss_bytes()), max(peak_heap, edge.heap_bytes())
                    time.sleep(0.25)
                lines = answered(sockets)
            refused = sum(line.startswith("HTTP/1.1 503") for line in lines)
            print(
                f"{args.senders} slow senders from {label}, each 15 of a 16 MB body sent, then held: Envoy RSS "
                f"{idle_rss / MB:.0f} -> {peak_rss / MB:.0f} MB, heap {idle_heap / MB:.0f} -> {peak_heap / MB:.0f} MB; "
                f"{refused} cut off at once (503 OVERLOADED), the others held until the request timeout"
            )
            time.sleep(2)  # their leases come back at the next purge
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
