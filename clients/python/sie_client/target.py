"""Where the client connects: `host:port`, or an `http://` / `https://` URL as the reference SDK takes.

gRPC has no URL: a URL names the host and port of a gRPC server (Envoy's HTTP port serves native
gRPC too), and its scheme says whether to use TLS. A path would be silently ignored, so it is refused.
gRPC's own target names (`dns:///host:port`, `unix:/path`, ...) are passed to grpc as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}
# Name-resolver schemes grpc itself understands.
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:")


@dataclass(frozen=True)
class Target:
    # host:port for grpc.
    address: str
    # True for https:// URLs.
    tls: bool
    # The address as a URL: scheme://host:port.
    base_url: str


def parse_target(target: str, *, tls: bool = False) -> Target:
    """`host:port`, `http://host[:port]` or `https://host[:port]` (TLS); `tls` applies to the other forms."""
    if target.startswith(_GRPC_SCHEMES):
        return Target(target, tls, target)
    bare = "://" not in target
    if bare and (not target or ":" not in target.strip("[]")):
        raise ValueError(f"target {target!r} is not host:port or an http(s):// URL")
    parts = urlsplit(f"{'https' if tls else 'http'}://{target}" if bare else target)
    if parts.scheme not in _DEFAULT_PORTS:
        raise ValueError(f"target {target!r}: the scheme must be http:// or https://, not {parts.scheme}://")
    if not parts.hostname:
        raise ValueError(f"target {target!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"target {target!r}: credentials in the URL would not be sent; give the key as api_key=")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"target {target!r}: gRPC takes no path or query; give scheme://host:port only")
    try:
        port = parts.port if parts.port is not None or bare else _DEFAULT_PORTS[parts.scheme]
    except ValueError:
        port = None
    if not port:  # none after host: (or out of range, or 0, which would silently be another port)
        raise ValueError(f"target {target!r}: the port must be a number from 1 to 65535")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    address = f"{host}:{port}"
    return Target(address, parts.scheme == "https", f"{parts.scheme}://{address}")
