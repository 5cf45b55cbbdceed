"""Every knob of the config service, in one typed object (flags > SIE_* env > defaults)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from sie_common.runtime.settings import SettingsError, setting
from sie_common.runtime.transport import DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, DEFAULT_MAX_SEND_MESSAGE_BYTES


@dataclass(frozen=True)
class ConfigSettings:
    host: str = setting("0.0.0.0", env="SIE_HOST", help="address to listen on")
    port: int = setting(50071, env="SIE_PORT", help="gRPC port")
    advertise_address: str | None = setting(None, env="SIE_ADVERTISE_ADDRESS", help="host:port other replicas name when they send writers to this leader (default: SIE_HOST:port, or hostname:port when listening on all addresses)")
    etcd_endpoints: tuple[str, ...] = setting(("127.0.0.1:2379",), env="SIE_ETCD_ENDPOINTS", help="comma-separated etcd client endpoints (host:port)")
    etcd_prefix: str = setting("/sie/", env="SIE_ETCD_PREFIX", help="prefix of every key the engine keeps in etcd")
    bundles_dir: str | None = setting(None, env="SIE_BUNDLES_DIR", help="directory of bundle YAML files published to etcd when this replica becomes leader (default: the repository's bundles/ in a checkout; required for an installed service)")
    admin_token: str | None = setting(None, env="SIE_ADMIN_TOKEN", help="bearer token that AddModel, ExportConfigs, ListModelConfigs and GetModelConfig require; unset: AddModel is refused (ADMIN_DISABLED) unless SIE_ALLOW_UNAUTHENTICATED_ADMIN")
    allow_unauthenticated_admin: bool = setting(False, env="SIE_ALLOW_UNAUTHENTICATED_ADMIN", help="without SIE_ADMIN_TOKEN, let anyone who reaches the port add models; only on a loopback SIE_HOST (a local dev stack)")
    allow_remote_code: bool = setting(False, env="SIE_ALLOW_REMOTE_CODE", help="accept AddModel configs whose profiles set trust_remote_code; off: they are refused (REMOTE_CODE_DISABLED)")
    leader_ttl_s: int = setting(10, env="SIE_CONFIG_LEADER_TTL_S", help="lease TTL of the leader key: a dead leader is replaced within about this long")
    idempotency_ttl_s: int = setting(86400, env="SIE_IDEMPOTENCY_TTL_S", help="how long an idempotency-key's first answer is replayed")
    tls_cert_file: str | None = setting(None, env="SIE_TLS_CERT_FILE", help="PEM certificate (chain) this server presents; with SIE_TLS_KEY_FILE the gRPC port accepts TLS only")
    tls_key_file: str | None = setting(None, env="SIE_TLS_KEY_FILE", help="PEM private key of SIE_TLS_CERT_FILE")
    tls_client_ca_file: str | None = setting(None, env="SIE_TLS_CLIENT_CA_FILE", help="PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS)")
    max_receive_message_bytes: int = setting(DEFAULT_MAX_RECEIVE_MESSAGE_BYTES, env="SIE_MAX_RECEIVE_MESSAGE_BYTES", help="largest request message accepted; larger ones get RESOURCE_EXHAUSTED")
    max_send_message_bytes: int = setting(DEFAULT_MAX_SEND_MESSAGE_BYTES, env="SIE_MAX_SEND_MESSAGE_BYTES", help="largest response message sent; a larger answer fails with RESOURCE_EXHAUSTED")
    log_level: str = setting("INFO", env="SIE_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR")
    # Observability (docs/observability.md).
    metrics_port: int = setting(9097, env="SIE_CONFIG_METRICS_PORT", help="HTTP port serving /metrics (Prometheus), /healthz and /readyz; 0 disables it")
    log_json: bool = setting(False, env="SIE_LOG_JSON", help="log one JSON object per line: timestamp, level, logger, message, and model, request_id, trace_id, latency_ms when known")
    tracing_enabled: bool = setting(False, env="SIE_TRACING_ENABLED", help="export OpenTelemetry traces, set up by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, ...)")

    def __post_init__(self) -> None:
        if self.allow_unauthenticated_admin and not _is_loopback(self.host):
            raise SettingsError(
                f"SIE_ALLOW_UNAUTHENTICATED_ADMIN=true opens model writes to anyone who reaches the port, so it needs a loopback"
                f" SIE_HOST (127.0.0.1, ::1 or localhost), not {self.host!r}; set SIE_ADMIN_TOKEN instead"
            )


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
