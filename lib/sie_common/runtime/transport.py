"""How every gRPC server listens and every internal channel connects: TLS, mutual TLS, message size limits.

A server with a certificate and key listens with TLS only (a plaintext client
cannot complete a call); adding a client CA makes it mutual: a client must
present a certificate that CA signed. Without a certificate it listens in
plaintext. Message size limits apply either way; grpc itself refuses a larger
message with RESOURCE_EXHAUSTED before any handler runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from sie_common.runtime.settings import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, DEFAULT_MAX_SEND_MESSAGE_BYTES, SettingsError

# Internal channels (to etcd, to workers) reconnect within a second once the far end is back: gRPC's
# default backoff grows to minutes. After an etcd outage every client must be back well inside the
# shortest lease TTL, or live workers' registrations expire; a restarted worker must get calls again.
RECONNECT_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1000,
}

# Calls a server's grpc holds before its handlers take them up (a burst on one channel); past it, grpc cancels them.
MAX_PENDING_CALLS = 8192


@dataclass(frozen=True)
class ServerTransport:
    """A server's TLS files and message limits, taken from its settings' fields of the same names."""

    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None
    max_receive_message_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
    max_send_message_bytes: int = DEFAULT_MAX_SEND_MESSAGE_BYTES

    @classmethod
    def of(cls, settings: Any) -> ServerTransport:
        transport = cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})
        transport.check()
        return transport

    def check(self) -> None:
        """Refuse half a TLS set-up and limits that are not positive, naming the settings."""
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise SettingsError("SIE_TLS_CERT_FILE and SIE_TLS_KEY_FILE go together: set both for TLS, or neither")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise SettingsError("SIE_TLS_CLIENT_CA_FILE (mutual TLS) needs SIE_TLS_CERT_FILE and SIE_TLS_KEY_FILE")
        for name in ("max_receive_message_bytes", "max_send_message_bytes"):
            if getattr(self, name) <= 0:
                raise SettingsError(f"SIE_{name.upper()} must be a positive number of bytes, got {getattr(self, name)}")

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert_file)

    def server_options(self) -> list[tuple[str, int]]:
        """Options for grpc.aio.server(options=...). grpc sets SO_REUSEPORT by default, which lets a second
        server (another stack, an orphan) bind a taken port and silently share its calls: turned off. Its BDP probe
        widens a connection's HTTP/2 receive windows as far as the link allows, so a caller that writes and never
        reads its answers parks that much of its requests in the server (0.7 GB for 40 such streams on loopback):
        turned off, windows stay at grpc's fixed size and flow control holds the writer back. On loopback that
        costs nothing (a 16 MB message's round trip was faster without it); across a high-latency link, large
        messages take more round trips. grpc keeps the calls its server has not yet taken up in a backlog and, past
        1,000 of them, cancels new ones at random (from 1,000 to 3,000 calls: 726 of 3,000 tiny calls sent at once on
        one channel came back CANCELLED): the backlog holds MAX_PENDING_CALLS, each of which costs about 10 KB
        until it is taken up (its message is not read before then), and only calls past it are CANCELLED."""
        return [
            ("grpc.max_receive_message_length", self.max_receive_message_bytes),
            ("grpc.max_send_message_length", self.max_send_message_bytes),
            ("grpc.so_reuseport", 0),
            ("grpc.http2.bdp_probe", 0),
            ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
            ("grpc.server.max_pending_requests_hard_limit", MAX_PENDING_CALLS),
        ]

    def listen(self, server: grpc.aio.Server, address: str) -> None:
        """Bind `address`, with TLS when a certificate is set; OSError naming the address when it cannot be bound."""
        try:
            bound = (
                server.add_secure_port(address, self._credentials()) if self.tls else server.add_insecure_port(address)
            )
        except RuntimeError:  # grpc's "Failed to bind to address"
            bound = 0
        if bound == 0:
            raise OSError(
                f"cannot listen on {address}: the address is in use (another server, another stack or an orphaned "
                "process holds the port; servers bind with grpc.so_reuseport=0, so a port is never shared) or is not "
                "this machine's; stop that process or set another port (SIE_HOST / SIE_PORT)"
            )

    def _credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(_read(self.tls_key_file, "SIE_TLS_KEY_FILE"), _read(self.tls_cert_file, "SIE_TLS_CERT_FILE"))],
            root_certificates=_read(self.tls_client_ca_file, "SIE_TLS_CLIENT_CA_FILE")
            if self.tls_client_ca_file
            else None,
            require_client_auth=bool(self.tls_client_ca_file),
        )


def channel_credentials(
    ca_file: str | None, cert_file: str | None = None, key_file: str | None = None
) -> grpc.ChannelCredentials:
    """TLS credentials for a client channel: trust `ca_file` (default: the system roots), and present
    `cert_file`/`key_file` for mutual TLS."""
    if bool(cert_file) != bool(key_file):
        raise SettingsError("a client certificate and its key go together: set both, or neither")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca_file, "CA file") if ca_file else None,
        private_key=_read(key_file, "key file") if key_file else None,
        certificate_chain=_read(cert_file, "certificate file") if cert_file else None,
    )


def _read(path: str | None, what: str) -> bytes:
    assert path is not None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise SettingsError(f"{what} {path!r} cannot be read: {error.strerror or error}") from None


def listen_address(host: str, port: int) -> str:
    """grpc's address for `host` and `port`: an IPv6 host in brackets (SIE_HOST=:: was ':::50051', which grpc cannot
    parse, and a service stopped saying the address was in use)."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"
