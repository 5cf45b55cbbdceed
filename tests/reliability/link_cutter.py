"""A loopback TCP relay in front of a server that a test can cut (a network partition) and restore.

Only the processes pointed at the relay are cut off; everything else still
reaches the server directly.
"""

from __future__ import annotations

import socket
import threading

from worker_process import free_port


class LinkCutter:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._cut = False
        self._closed = False
        # Connections relayed so far (a client's channels that connected through it).
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True, name="link-cutter").start()

    def cut(self) -> None:
        """Drop every open connection and refuse new ones until `restore`."""
        with self._lock:
            self._cut = True
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._closed = True
        _close(self._listener)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._cut:
                    _close(client)
                    continue
            try:
                server = socket.create_connection(self._target, timeout=5)
            except OSError:
                _close(client)
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
                self.accepted += 1
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(source)
                self._open.discard(sink)
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
