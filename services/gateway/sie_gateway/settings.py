"""Every knob of the gateway, in one typed object (flags > SIE_* env > defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from sie_common.edge.auth import check_auth_mode
from sie_common.edge.encode_stream import EncodeStreamSettings
from sie_common.edge.request_bounds import RequestBoundSettings
from sie_common.runtime.settings import ServiceSettings, SettingsError, metrics_port_setting, port_setting, setting
from sie_gateway.client_address import trusted_networks
from sie_gateway.http_adapter.settings import HttpAdapterSettings


@dataclass(frozen=True)
class GatewaySettings(HttpAdapterSettings, RequestBoundSettings, EncodeStreamSettings, ServiceSettings):
    port: int = port_setting(50051)
    configured_gpus: tuple[str, ...] = setting(
        (),
        env="SIE_GATEWAY_CONFIGURED_GPUS",
        help="comma-separated machine profiles that may scale from zero: with no live worker they answer "
        "UNAVAILABLE/PROVISIONING; other unknown profiles are FAILED_PRECONDITION",
    )
    max_in_flight: int = setting(
        1024, env="SIE_GATEWAY_MAX_IN_FLIGHT", help="requests in flight through this gateway before RESOURCE_EXHAUSTED"
    )
    worker_window: int = setting(
        64, env="SIE_GATEWAY_WORKER_WINDOW", help="requests in flight on one worker's stream; more wait for a slot"
    )
    max_attempts: int = setting(
        3, env="SIE_GATEWAY_MAX_ATTEMPTS", help="workers one request may be tried on when workers vanish under it"
    )
    request_timeout_s: float = setting(
        300.0, env="SIE_GATEWAY_REQUEST_TIMEOUT_S", help="deadline for calls that set none"
    )
    provisioning_retry_s: float = setting(
        5.0, env="SIE_GATEWAY_PROVISIONING_RETRY_S", help="retry delay sent with UNAVAILABLE/PROVISIONING"
    )
    pool_default_ttl_s: int = setting(
        60, env="SIE_POOL_DEFAULT_TTL_S", help="lease of a resource pool created without ttl_s"
    )
    pools_enabled: bool = setting(
        False,
        env="SIE_POOLS_ENABLED",
        help="allow CreatePool through the API (pools reserve workers); off: FAILED_PRECONDITION/POOLS_DISABLED",
    )
    pool_max_workers: int = setting(
        4,
        env="SIE_POOL_MAX_WORKERS",
        help="workers one pool may reserve (sum over machine profiles); more: INVALID_ARGUMENT/POOL_TOO_LARGE",
    )
    pool_max_ttl_s: int = setting(
        3600, env="SIE_POOL_MAX_TTL_S", help="longest pool lease; longer: INVALID_ARGUMENT/POOL_TTL_TOO_LONG"
    )
    pool_max_lifetime_s: int = setting(
        86400,
        env="SIE_POOL_MAX_LIFETIME_S",
        help="longest a pool lives from its creation, renewals included: a renewal that would carry its lease past "
        "that is FAILED_PRECONDITION/POOL_LIFETIME_REACHED and the pool ends at its current expiry",
    )
    pool_max_share: float = setting(
        0.5,
        env="SIE_POOL_MAX_SHARE",
        help="fraction (0-1] of each bundle's workers that pools may take (shared ones and those already in pools "
        "created through the API) one pool may hold, rounded down",
    )
    pool_shared_workers: int = setting(
        1,
        env="SIE_POOL_SHARED_WORKERS",
        help="workers of each bundle that pools created through the API never take: they stay with requests "
        "without x-sie-pool",
    )
    pool_quota_pools: int = setting(
        2,
        env="SIE_POOL_QUOTA_POOLS",
        help="pools one caller (bearer token; all callers together without auth) may hold at once; more: "
        "RESOURCE_EXHAUSTED/POOL_COUNT_EXCEEDED",
    )
    pool_quota_workers: int = setting(
        4,
        env="SIE_POOL_QUOTA_WORKERS",
        help="workers the pools of one caller (bearer token; all callers together without auth) may reserve; more: "
        "RESOURCE_EXHAUSTED/POOL_QUOTA_EXCEEDED",
    )
    pool_token_quotas: tuple[str, ...] = setting(
        (),
        env="SIE_POOL_TOKEN_QUOTAS",
        help="comma-separated token=workers: a token's own pool quota instead of SIE_POOL_QUOTA_WORKERS",
    )
    auth_mode: str = setting(
        "none",
        env="SIE_AUTH_MODE",
        help="none, or static: every Inference call (inference, models, pools) needs a bearer token from "
        "SIE_AUTH_TOKENS",
    )
    auth_tokens: tuple[str, ...] = setting(
        (), env="SIE_AUTH_TOKENS", help="comma-separated bearer tokens accepted with SIE_AUTH_MODE=static"
    )
    worker_token: str | None = setting(
        None,
        env="SIE_WORKER_TOKEN",
        help="bearer token the gateway presents on its Work streams to workers; workers with the same "
        "SIE_WORKER_TOKEN refuse streams without it",
    )
    worker_tls_ca_file: str | None = setting(
        None,
        env="SIE_WORKER_TLS_CA_FILE",
        help="PEM CA bundle that signed the workers' certificates: when set, the gateway reaches workers over TLS",
    )
    worker_tls_cert_file: str | None = setting(
        None,
        env="SIE_WORKER_TLS_CERT_FILE",
        help="PEM client certificate the gateway presents to workers (mutual TLS; workers set SIE_TLS_CLIENT_CA_FILE)",
    )
    worker_tls_key_file: str | None = setting(
        None, env="SIE_WORKER_TLS_KEY_FILE", help="PEM private key of SIE_WORKER_TLS_CERT_FILE"
    )
    allow_unauthenticated_workers: bool = setting(
        False,
        env="SIE_ALLOW_UNAUTHENTICATED_WORKERS",
        help="present SIE_WORKER_TOKEN although no worker is authenticated (no etcd credential, so anyone who reaches "
        "etcd may register a worker, and no SIE_WORKER_TLS_CA_FILE): for tests on a trusted host only",
    )
    trusted_proxies: tuple[str, ...] = setting(
        ("127.0.0.1", "::1"),
        env="SIE_GATEWAY_TRUSTED_PROXIES",
        help="comma-separated addresses and CIDR ranges of the proxies (Envoy) whose x-sie-client-address header "
        "names the client a request comes from, for its share of the request budget; from any other peer the header "
        "is ignored and the peer's own address is the caller. Default: loopback (the local stack's Envoy); where "
        "Envoy runs elsewhere (Kubernetes), its pods' addresses",
    )
    grpc_read_evict_after_s: float = setting(
        1.0,
        env="SIE_GATEWAY_GRPC_READ_EVICT_AFTER_S",
        help="seconds after which a unary gRPC call's message the gateway has asked for and not all received may be "
        "dropped (UNAVAILABLE OVERLOADED, retryable) when the request budget is full and another call's message needs "
        "its room. A read holds room for the largest message from when it begins, whether or not its caller sends a "
        "byte (grpc tells the gateway only once a whole message has arrived), so this is shorter than "
        "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S, which EncodeStreams waiting for their next message keep",
    )
    metrics_port: int = metrics_port_setting(9096, env="SIE_GATEWAY_METRICS_PORT")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_http_adapter()
        check_auth_mode(self.auth_mode, self.auth_tokens)
        self._check_worker_token_recipients()
        self.token_pool_quotas()  # refuse a malformed SIE_POOL_TOKEN_QUOTAS at start-up
        trusted_networks(self.trusted_proxies)
        if self.grpc_read_evict_after_s <= 0:
            raise SettingsError(
                f"SIE_GATEWAY_GRPC_READ_EVICT_AFTER_S must be positive, got {self.grpc_read_evict_after_s}"
            )
        for name in (
            "pool_default_ttl_s",
            "pool_max_workers",
            "pool_max_ttl_s",
            "pool_quota_pools",
            "encode_stream_window",
            "max_encode_streams",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"SIE_{name.upper()} must be positive, got {getattr(self, name)}")
        if self.pool_default_ttl_s > self.pool_max_ttl_s:
            raise SettingsError("SIE_POOL_DEFAULT_TTL_S must not exceed SIE_POOL_MAX_TTL_S")
        if self.pool_max_ttl_s > self.pool_max_lifetime_s:
            raise SettingsError("SIE_POOL_MAX_TTL_S must not exceed SIE_POOL_MAX_LIFETIME_S")
        if not 0 < self.pool_max_share <= 1:
            raise SettingsError(f"SIE_POOL_MAX_SHARE must be in (0, 1], got {self.pool_max_share}")
        if self.pool_shared_workers < 0:
            raise SettingsError(f"SIE_POOL_SHARED_WORKERS must not be negative, got {self.pool_shared_workers}")

    def _check_worker_token_recipients(self) -> None:
        """The worker token goes only to workers the gateway can authenticate: registered by etcd's worker role
        (the gateway's own etcd credential proves etcd has authentication on) or holding a certificate from
        SIE_WORKER_TLS_CA_FILE."""
        authenticated = bool(self.etcd_username) or bool(self.worker_tls_ca_file)
        if self.worker_token and not authenticated and not self.allow_unauthenticated_workers:
            raise SettingsError(
                "SIE_WORKER_TOKEN is set, but nothing authenticates the workers it would be sent to: anyone who can "
                "write to etcd could register one and receive it. Give the gateway its etcd credential "
                "(SIE_ETCD_USERNAME, with etcd authentication on), or SIE_WORKER_TLS_CA_FILE (docs/security.md)"
            )

    def token_pool_quotas(self) -> dict[str, int]:
        """Token -> the workers its pools may reserve, from SIE_POOL_TOKEN_QUOTAS (errors never show the token)."""
        quotas = {}
        for entry in self.pool_token_quotas:
            token, _, workers = entry.rpartition("=")
            if not token or not workers.isdigit():
                raise SettingsError("SIE_POOL_TOKEN_QUOTAS: each entry must be token=workers (a whole number)")
            quotas[token] = int(workers)
        return quotas
