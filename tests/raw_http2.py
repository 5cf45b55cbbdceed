"""A bare HTTP/2 client for the edge tests, its frames written by hand (RFC 9113, header blocks per RFC 7541 without
compression), so a test can do what client libraries will not (announce bodies and never send them, hold 100 streams
open, send more headers than a server takes, end a body in trailers) and see what became of each stream: reset, or
answered (with the answer's body; header blocks from the server are not decoded)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator, Sequence

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE = 0, 1, 3, 4, 6, 7, 8
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME = 16384


def _integer(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer with a `prefix_bits`-bit prefix (RFC 7541, 5.1)."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    return bytes([*out, value])


def header_block(headers: Sequence[tuple[str, str]]) -> bytes:
    """Each header as a literal field without indexing, its name new, nothing Huffman-coded (RFC 7541, 6.2.2)."""
    block = b""
    for name, value in headers:
        key, text = name.encode(), value.encode()
        block += b"\x00" + _integer(len(key), 7) + key + _integer(len(text), 7) + text
    return block


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


class Connection:
    """One HTTP/2 connection (prior knowledge, cleartext) to 127.0.0.1:`port` from `source`."""

    def __init__(self, port: int, source: str = "127.0.0.1") -> None:
        self.socket = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
        self.socket.sendall(PREFACE + frame(SETTINGS, 0, 0))
        self.next_stream = 1
        self.pending = b""
        self.window = 65535  # the connection's send window
        self.initial_window = 65535
        self.stream_windows: dict[int, int] = {}
        self.resets: dict[int, int] = {}  # stream -> RST_STREAM error code
        self.bodies: dict[int, bytes] = {}  # stream -> the answer's DATA so far (present once its headers came)
        self.ended: set[int] = set()  # streams whose answer is complete
        self.goaway: int | None = None  # the error code of a GOAWAY
        self.closed = False

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        headers: Sequence[tuple[str, str]] = (),
        body: bytes | None = None,
        end: bool = True,
    ) -> int:
        """Opens a stream with `headers` (after the pseudo-headers) and sends `body`; `end`: the request ends with it
        (without `body`, with its headers). Returns the stream id."""
        stream = self.next_stream
        self.next_stream += 2
        self.stream_windows[stream] = self.initial_window
        pseudo = [(":method", method), (":scheme", "http"), (":path", path), (":authority", "edge")]
        ends_now = end and body is None
        self.socket.sendall(
            frame(HEADERS, END_HEADERS | (END_STREAM if ends_now else 0), stream, header_block([*pseudo, *headers]))
        )
        if body is not None:
            self.send(stream, body, end)
        return stream

    def send(self, stream: int, data: bytes, end: bool = False) -> None:
        """DATA on `stream`, within the flow-control windows (waiting for the server's updates)."""
        if not data:
            if end:
                self.socket.sendall(frame(DATA, END_STREAM, stream))
            return
        offset = 0
        while offset < len(data):
            room = min(self.window, self.stream_windows[stream], MAX_FRAME)
            if room <= 0:
                opened = self.read(
                    lambda: min(self.window, self.stream_windows[stream]) > 0 or stream in self.resets, 10
                )
                if not opened or stream in self.resets:
                    return
                continue
            piece = data[offset : offset + room]
            offset += len(piece)
            self.socket.sendall(frame(DATA, END_STREAM if end and offset == len(data) else 0, stream, piece))
            self.window -= len(piece)
            self.stream_windows[stream] -= len(piece)

    def trailers(self, stream: int, headers: Sequence[tuple[str, str]]) -> None:
        """Ends `stream` with a trailing header block."""
        self.socket.sendall(frame(HEADERS, END_HEADERS | END_STREAM, stream, header_block(headers)))

    def read(self, until: Callable[[], bool], timeout_s: float) -> bool:
        """Reads frames until `until()` holds (True), the time is up or the connection ends (False)."""
        deadline = time.monotonic() + timeout_s
        while not until():
            if self.closed or time.monotonic() > deadline:
                return False
            self.socket.settimeout(max(0.01, min(1.0, deadline - time.monotonic())))
            try:
                chunk = self.socket.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return until()
            self.pending += chunk
            self._frames()
        return True

    def answered(self, stream: int) -> bool:
        return stream in self.ended or stream in self.resets

    def _frames(self) -> None:
        while len(self.pending) >= 9:
            length = int.from_bytes(self.pending[:3], "big")
            if len(self.pending) < 9 + length:
                return
            kind, flags = self.pending[3], self.pending[4]
            stream = int.from_bytes(self.pending[5:9], "big") & 0x7FFFFFFF
            payload = self.pending[9 : 9 + length]
            self.pending = self.pending[9 + length :]
            self._frame(kind, flags, stream, payload)

    def _reply(self, data: bytes) -> None:
        """Frames the protocol asks for (acknowledgements, window updates); a connection the server closed gets none."""
        try:
            self.socket.sendall(data)
        except OSError:
            self.closed = True

    def _frame(self, kind: int, flags: int, stream: int, payload: bytes) -> None:
        if kind == SETTINGS and not flags & ACK:
            for at in range(0, len(payload), 6):
                if int.from_bytes(payload[at : at + 2], "big") == INITIAL_WINDOW_SIZE:
                    value = int.from_bytes(payload[at + 2 : at + 6], "big")
                    for open_stream in self.stream_windows:
                        self.stream_windows[open_stream] += value - self.initial_window
                    self.initial_window = value
            self._reply(frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            self._reply(frame(PING, ACK, 0, payload))
        elif kind == WINDOW_UPDATE:
            increment = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
            if stream == 0:
                self.window += increment
            elif stream in self.stream_windows:
                self.stream_windows[stream] += increment
        elif kind == RST_STREAM:
            self.resets[stream] = int.from_bytes(payload[:4], "big")
        elif kind == GOAWAY:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif kind in (HEADERS, DATA):
            self.bodies[stream] = self.bodies.get(stream, b"") + (payload if kind == DATA else b"")
            if kind == DATA and payload:  # give the window back, so long answers keep coming
                update = len(payload).to_bytes(4, "big")
                self._reply(frame(WINDOW_UPDATE, 0, 0, update) + frame(WINDOW_UPDATE, 0, stream, update))
            if flags & END_STREAM:
                self.ended.add(stream)


@contextlib.contextmanager
def connections(port: int, count: int, source: str = "127.0.0.1") -> Iterator[list[Connection]]:
    opened: list[Connection] = []
    try:
        opened.extend(Connection(port, source) for _ in range(count))
        yield opened
    finally:
        for connection in opened:
            connection.close()
