"""The client's set-up: where it connects (target, TLS, credentials), how it routes (machine profile, pool), the
defaults every call starts from, and one unary call with its retries."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Self

import grpc

from sie.v1 import inference_pb2_grpc
from sie_client.retry import Metadata, Response, RetryPolicy, call_with_retries
from sie_client.target import parse_target

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MACHINE_PROFILE_HEADER = "x-sie-machine-profile"
POOL_HEADER = "x-sie-pool"


class Connection:
    def __init__(
        self,
        target: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        gpu: str | None = None,
        pool: str | None = None,
        options: Mapping[str, Any] | None = None,
        stream_batch_size: int = 256,
        stream_window: int = 8,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
    ) -> None:
        """`target` (or `base_url=`) is host:port or an http(s):// URL of a worker, a gateway or Envoy.
        `gpu` picks a machine profile and `pool` a resource pool on a gateway (defaults for each call's
        own); `options` are defaults merged under each call's own. Lists longer than
        `stream_batch_size` are sent as several requests, `stream_window` at a time, on one stream.
        TLS is on with an https:// URL, `tls=True` or any of the PEM arguments: `root_certificates` to
        trust (default: the system's), `certificate_chain` and `private_key` for mutual TLS."""
        if (target is None) == (base_url is None):
            raise ValueError("give the server as `target` or as `base_url=`, once")
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a positive, finite number of seconds, not {timeout_s}")
        if stream_batch_size < 1 or stream_window < 1:  # a window of 0 would never send a request
            raise ValueError(
                f"stream_batch_size and stream_window must be >= 1, not {stream_batch_size} and {stream_window}"
            )
        tls = tls or bool(root_certificates or certificate_chain or private_key)
        parsed = parse_target(target or base_url or "", tls=tls)
        self.target = parsed.address
        self.base_url = parsed.base_url
        self.timeout_s = timeout_s
        self.options = dict(options or {})
        self._stream_batch_size = stream_batch_size
        self._stream_window = stream_window
        self._auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._gpu = gpu
        self._pool = pool
        self._metadata = self._routing()
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

    def _routing(self, gpu: str | None = None, pool: str | None = None) -> Metadata:
        """Call metadata: credentials, and the machine profile and pool (the call's, else the client's)."""
        headers = ((MACHINE_PROFILE_HEADER, gpu or self._gpu), (POOL_HEADER, pool or self._pool))
        return self._auth + tuple((key, value) for key, value in headers if value)

    async def _call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        policy: RetryPolicy,
        metadata: Metadata | None = None,
    ) -> Response:
        """A unary call with the client's deadline and routing (or `metadata`), retried as `policy` says."""
        return await call_with_retries(
            method, request, policy, metadata=self._metadata if metadata is None else metadata, timeout_s=self.timeout_s
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()
