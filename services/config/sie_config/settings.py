"""Every knob of the config service, in one typed object (flags > SIE_* env > defaults)."""

from __future__ import annotations

from dataclasses import dataclass

from sie_common.cluster.model_config import weight_packages_setting
from sie_common.runtime.settings import ServiceSettings, SettingsError, metrics_port_setting, port_setting, setting

# etcd refuses a request over 1.5 MiB by default: a stored config, with the write's other keys, stays well under it.
MAX_MODEL_CONFIG_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ConfigSettings(ServiceSettings):
    port: int = port_setting(50071)
    advertise_address: str | None = setting(
        None,
        env="SIE_ADVERTISE_ADDRESS",
        help="host:port other replicas name when they send writers to this leader (default: SIE_HOST:port, or "
        "hostname:port when listening on all addresses)",
    )
    bundles_dir: str | None = setting(
        None,
        env="SIE_BUNDLES_DIR",
        help="directory of bundle YAML files published to etcd when this replica becomes leader (default: the "
        "repository's bundles/ in a checkout; required for an installed service)",
    )
    admin_token: str | None = setting(
        None,
        env="SIE_ADMIN_TOKEN",
        help="bearer token that AddModel, ExportConfigs, ListModelConfigs and GetModelConfig require; unset: "
        "AddModel is refused (ADMIN_DISABLED) unless SIE_ALLOW_UNAUTHENTICATED_ADMIN",
    )
    allow_unauthenticated_admin: bool = setting(
        False,
        env="SIE_ALLOW_UNAUTHENTICATED_ADMIN",
        help="without SIE_ADMIN_TOKEN, let anyone who reaches the port add models; only on a loopback SIE_HOST (a "
        "local dev stack)",
    )
    allow_remote_code: bool = setting(
        False,
        env="SIE_ALLOW_REMOTE_CODE",
        help="accept AddModel configs whose profiles set trust_remote_code; off: they are refused "
        "(REMOTE_CODE_DISABLED)",
    )
    max_model_config_bytes: int = setting(
        256 * 1024,
        env="SIE_MAX_MODEL_CONFIG_BYTES",
        help="largest model config AddModel accepts, and largest a model's stored config may grow to with added "
        f"profiles (bytes; at most {MAX_MODEL_CONFIG_BYTES}); larger: INVALID_ARGUMENT CONFIG_TOO_LARGE",
    )
    weight_packages: tuple[str, ...] = weight_packages_setting()
    leader_ttl_s: int = setting(
        10,
        env="SIE_CONFIG_LEADER_TTL_S",
        help="lease TTL of the leader key: a dead leader is replaced within about this long",
    )
    idempotency_ttl_s: int = setting(
        86400, env="SIE_IDEMPOTENCY_TTL_S", help="how long an idempotency-key's first answer is replayed"
    )
    metrics_port: int = metrics_port_setting(9097, env="SIE_CONFIG_METRICS_PORT")

    def __post_init__(self) -> None:
        if not 1024 <= self.max_model_config_bytes <= MAX_MODEL_CONFIG_BYTES:
            raise SettingsError(
                f"SIE_MAX_MODEL_CONFIG_BYTES must be 1024 to {MAX_MODEL_CONFIG_BYTES} (etcd refuses larger writes), "
                f"got {self.max_model_config_bytes}"
            )
        if self.allow_unauthenticated_admin and not self.loopback_only:
            raise SettingsError(
                f"SIE_ALLOW_UNAUTHENTICATED_ADMIN=true opens model writes to anyone who reaches the port, so it "
                f"needs a loopback"
                f" SIE_HOST (127.0.0.1, ::1 or localhost), not {self.host!r}; set SIE_ADMIN_TOKEN instead"
            )
