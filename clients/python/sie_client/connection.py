"""The client's set-up: where it connects (target, TLS, credentials), how it routes (machine profile, pool), the
defaults every call starts from, and one unary call with its retries.

The constructor takes the reference SDK's arguments (same names, kinds and defaults) and ours; what a reference
argument means here is in docs/migration.md."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import grpc

from sie.v1 import inference_pb2_grpc
from sie_client.errors import NotSupportedError, SIEConnectionError
from sie_client.retry import DEFAULT_POLICY, Metadata, Response, RetryPolicy, call_with_retries
from sie_client.status import CallSite, rpc_name
from sie_client.target import parse_target
from sie_client.types import PoolSpec

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MACHINE_PROFILE_HEADER = "x-sie-machine-profile"
POOL_HEADER = "x-sie-pool"
# Header names gRPC metadata allows (lower case), and those the client sets itself.
_HEADER_NAME = re.compile(r"[a-z0-9_.-]+")
_OURS = ("authorization", MACHINE_PROFILE_HEADER, POOL_HEADER, "content-type", "te", "user-agent")
# The reference's defaults: seconds to connect, and to wait for an answer once a request is sent.
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_READ_TIMEOUT_S = 150.0


class Connection:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        timeout_s: float | None = None,
        api_key: str | None = None,
        gpu: str | None = None,
        options: Mapping[str, Any] | None = None,
        pool: str | PoolSpec | None = None,
        max_connections: int | None = None,
        max_concurrency: int | None = None,
        control_plane_url: str | None = None,
        org: str | None = None,
        base_url_headers: Mapping[str, str] | None = None,
        connect_timeout_s: float | None = None,
        read_timeout_s: float | None = None,
        remote: Literal["forbid"] | None = None,
        http_client: object | None = None,
        target: str | None = None,
        stream_batch_size: int = 256,
        stream_window: int = 8,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
    ) -> None:
        """`base_url` (or `target=`) is an http(s):// URL or host:port of a worker, a gateway or Envoy; without
        either, the SIE_BASE_URL environment variable. `api_key` (default: SIE_API_KEY, when the URL is
        SIE_BASE_URL's) is sent as a bearer token. `timeout_s` sets both `connect_timeout_s` (default 10: how long a
        call waits for the connection) and `read_timeout_s` (default 150: each call's deadline); either overrides it.
        `gpu` picks a machine profile, or "pool/profile" a pool and profile; `pool` a resource pool by name, or a
        PoolSpec dict, created on the first call; both defaults for each call's own. `options` are defaults merged
        under each call's own; `base_url_headers` extra headers (https only). `max_concurrency` caps the calls in
        flight. Lists longer than `stream_batch_size` are sent as several requests, `stream_window` at a time.
        TLS is on with an https:// URL, `tls=True` or any of the PEM arguments: `root_certificates` to trust
        (default: the system's), `certificate_chain` and `private_key` for mutual TLS.

        `max_connections`, `control_plane_url` and `org` are accepted and change nothing (one HTTP/2 connection
        carries every call; there is no control plane); `remote="forbid"` is what this engine always does (it has no
        remote upstreams); `http_client` is a NotSupportedError (there is no HTTP client to give)."""
        if http_client is not None:
            raise NotSupportedError("http_client: this client speaks gRPC; give TLS and credentials as arguments")
        if remote not in (None, "forbid"):
            raise ValueError(f"remote must be 'forbid' or None, not {remote!r}")
        for name, count in (("max_connections", max_connections), ("max_concurrency", max_concurrency)):
            if count is not None and count < 1:
                raise ValueError(f"{name} must be >= 1, not {count}")
        if base_url is not None and target is not None:
            raise ValueError("give the server as `base_url` or as `target=`, once")
        address = base_url or target or os.environ.get("SIE_BASE_URL")
        if not address:
            raise ValueError("give the server as `base_url` (or `target=`), or set SIE_BASE_URL")
        connect_timeout_s, read_timeout_s = (
            _seconds(name, given, timeout_s, default)
            for name, given, default in (
                ("connect_timeout_s", connect_timeout_s, DEFAULT_CONNECT_TIMEOUT_S),
                ("read_timeout_s", read_timeout_s, DEFAULT_READ_TIMEOUT_S),
            )
        )
        if stream_batch_size < 1 or stream_window < 1:  # a window of 0 would never send a request
            raise ValueError(
                f"stream_batch_size and stream_window must be >= 1, not {stream_batch_size} and {stream_window}"
            )
        if pool is not None and not isinstance(pool, str) and "name" not in pool:
            raise ValueError("a pool spec names its pool: {'name': ..., 'gpus': {...}}")
        tls = tls or bool(root_certificates or certificate_chain or private_key)
        parsed = parse_target(address, tls=tls)
        if base_url_headers and not parsed.tls:
            raise ValueError("base_url_headers are sent over TLS only: give an https:// base_url")
        for key, value in (base_url_headers or {}).items():
            if not _HEADER_NAME.fullmatch(key.lower()) or key.lower().startswith("grpc-") or key.lower() in _OURS:
                raise ValueError(f"base_url_headers: {key!r} is not a header this client may send")
            if not isinstance(value, str) or not value.isprintable() or not value.isascii():
                raise ValueError(f"base_url_headers[{key!r}] must be printable ASCII")
        if api_key is None and _same_origin(address, os.environ.get("SIE_BASE_URL")):
            api_key = os.environ.get("SIE_API_KEY")
        self._target = parsed
        self.timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.options = dict(options or {})
        self._stream_batch_size = stream_batch_size
        self._stream_window = stream_window
        bearer: Metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._auth = bearer + tuple((key.lower(), value) for key, value in (base_url_headers or {}).items())
        self._gpu = gpu
        self._pool_spec = None if pool is None or isinstance(pool, str) else pool
        self._pool = pool if isinstance(pool, str) else None if pool is None else pool["name"]
        self._metadata = self._routing()
        self._slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        channel_options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if parsed.tls:
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            self._channel = grpc.aio.secure_channel(self.target, credentials, options=channel_options)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=channel_options)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)

    @property
    def base_url(self) -> str:
        """Where the client connects, as a URL: scheme://host:port."""
        return self._target.base_url

    @property
    def target(self) -> str:
        """The host:port (or gRPC target name) the client dials."""
        return self._target.address

    def _routing(self, gpu: str | None = None, pool: str | None = None) -> Metadata:
        """Call metadata: credentials, and the machine profile and pool (the call's, else the client's). A `gpu` of
        "pool/profile" (the reference's way to name a pool) names both."""
        gpu = gpu or self._gpu
        if gpu and "/" in gpu:
            named_pool, gpu = gpu.split("/", 1)
            if pool and pool != named_pool:
                raise ValueError(f"gpu={named_pool + '/' + gpu!r} names pool {named_pool!r}, pool= names {pool!r}")
            pool = named_pool
        headers = ((MACHINE_PROFILE_HEADER, gpu), (POOL_HEADER, pool or self._pool))
        return self._auth + tuple((key, value) for key, value in headers if value)

    async def _connected(self) -> None:
        """Wait up to `connect_timeout_s` for the channel to connect (or fail, which the call then reports):
        SIEConnectionError when it does neither, e.g. a peer that accepts TCP but never speaks HTTP/2."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.connect_timeout_s
        state = self._channel.get_state(try_to_connect=True)
        while state in (grpc.ChannelConnectivity.IDLE, grpc.ChannelConnectivity.CONNECTING):
            try:
                async with asyncio.timeout_at(deadline):
                    await self._channel.wait_for_state_change(state)
            except TimeoutError:
                raise SIEConnectionError(
                    f"no connection to {self.target} within connect_timeout_s={self.connect_timeout_s}"
                ) from None
            state = self._channel.get_state()

    def _in_flight(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """A slot of `max_concurrency` (none without it)."""
        return self._slots if self._slots is not None else contextlib.nullcontext()

    async def _call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        policy: RetryPolicy = DEFAULT_POLICY,
        metadata: Metadata | None = None,
    ) -> Response:
        """A unary call with the client's deadline and routing (or `metadata`), retried as `policy` says."""
        async with self._in_flight():
            await self._connected()
            return await call_with_retries(
                method,
                request,
                policy,
                metadata=self._metadata if metadata is None else metadata,
                site=self._site(request),
            )

    def _site(self, request: Any) -> CallSite:
        """The RPC that takes `request`, on this client's target, with its deadline (for the errors' messages)."""
        return CallSite(rpc_name(request), self.target, self.timeout_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()


def _seconds(name: str, given: float | None, shared: float | None, default: float) -> float:
    """A timeout: its own argument, else `timeout_s`, else the default; positive and finite (else ValueError)."""
    value = given if given is not None else shared if shared is not None else default
    if not 0 < value < math.inf:
        which = name if given is not None else "timeout_s"
        raise ValueError(f"{which} must be a positive, finite number of seconds, not {value}")
    return value


def _same_origin(address: str, other: str | None) -> bool:
    if not other:
        return False
    first, second = urlsplit(address if "://" in address else f"http://{address}"), urlsplit(other)
    return (first.scheme, first.hostname, first.port) == (second.scheme, second.hostname, second.port)
