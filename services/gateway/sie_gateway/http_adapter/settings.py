"""The HTTP adapter's settings: where it listens and the bounds of the bodies it reads (docs/configuration.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sie_common.runtime.settings import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, SettingsError, setting


@dataclass(frozen=True)
class HttpAdapterSettings:
    """Part of the gateway's settings (GatewaySettings extends it)."""

    http_port: int = setting(
        0,
        env="SIE_GATEWAY_HTTP_PORT",
        help="port of the HTTP adapter (the reference SDK's msgpack wire, Cohere/Jina rerank, TEI, OpenAI models; "
        "docs/http.md), which only Envoy should reach; 0: not served",
    )
    http_host: str = setting(
        "127.0.0.1",
        env="SIE_GATEWAY_HTTP_HOST",
        help="address the HTTP adapter listens on (loopback unless Envoy runs elsewhere: the Kubernetes base sets "
        "0.0.0.0 and a NetworkPolicy lets only Envoy in)",
    )
    http_max_body_bytes: int = setting(
        DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
        env="SIE_GATEWAY_HTTP_MAX_BODY_BYTES",
        help="largest request body the HTTP adapter reads (refused from its content-length before reading: 413)",
    )
    # A body in flight costs the gateway about 7 times its bytes (decoded, as a message, and the gateway's copy of
    # it; tests/test_http_adapter_memory.py): 96 MiB keeps that within the Kubernetes base's 1 GiB.
    http_max_body_budget_bytes: int = setting(
        96 * 2**20,
        env="SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES",
        help="body bytes the HTTP adapter holds for all requests at once (each counts the bytes of its body that "
        "have arrived, until it is answered; each costs the gateway about 7 times that); past it: 503 OVERLOADED "
        "with Retry-After. The gateway's gRPC messages share it (RESOURCE_EXHAUSTED OVERLOADED past it)",
    )
    http_max_body_budget_per_caller_bytes: int = setting(
        32 * 2**20,
        env="SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES",
        help="body bytes of one caller (one bearer token with SIE_AUTH_MODE=static, else one client address as Envoy "
        "sees it) the HTTP adapter holds at once, however many connections it opens; past it: 503 OVERLOADED with "
        "Retry-After. Shared with the caller's gRPC messages (one larger than it is always refused). At least "
        "SIE_GATEWAY_HTTP_MAX_BODY_BYTES",
    )
    http_body_evict_after_s: float = setting(
        5.0,
        env="SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S",
        help="seconds after which a body still arriving may be dropped (408 REQUEST_TIMEOUT) when the body budget is "
        "full and another request's bytes need room, oldest first; a body that has all arrived is never dropped",
    )
    http_body_timeout_s: float = setting(
        30.0,
        env="SIE_GATEWAY_HTTP_BODY_TIMEOUT_S",
        help="seconds the HTTP adapter waits for a request's whole body, from when it starts reading it; past it: "
        "408 REQUEST_TIMEOUT (bounds how long a slow sender holds its share of the body budget)",
    )
    http_max_depth: int = setting(
        32, env="SIE_GATEWAY_HTTP_MAX_DEPTH", help="deepest nesting of maps and arrays in a msgpack or JSON body"
    )
    http_max_container_len: int = setting(
        16384,
        env="SIE_GATEWAY_HTTP_MAX_CONTAINER_LEN",
        help="most entries of one msgpack or JSON map or array in a body (items: SIE_MAX_ITEMS_PER_REQUEST too)",
    )
    http_max_values: int = setting(
        262144,
        env="SIE_GATEWAY_HTTP_MAX_VALUES",
        help="most values (maps, arrays, strings, numbers, ...) in one msgpack or JSON body",
    )

    def check_http_adapter(self) -> None:
        """Refuse a port out of range and bounds that are not positive, naming the variable."""
        if not 0 <= self.http_port <= 65535:
            raise SettingsError(f"SIE_GATEWAY_HTTP_PORT={self.http_port}: a port, or 0 for none")
        for field in dataclasses.fields(HttpAdapterSettings):
            value = getattr(self, field.name)
            if field.name.startswith(("http_max_", "http_body_")) and value <= 0:
                raise SettingsError(f"{field.metadata['env']}={value}: must be positive")
        if self.http_max_body_budget_per_caller_bytes < self.http_max_body_bytes:
            raise SettingsError(
                f"SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES={self.http_max_body_budget_per_caller_bytes}: at "
                f"least SIE_GATEWAY_HTTP_MAX_BODY_BYTES ({self.http_max_body_bytes}), or no caller could send its "
                "largest body"
            )
