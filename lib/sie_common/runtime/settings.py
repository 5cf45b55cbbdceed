"""Typed service settings read from flags, then `SIE_*` environment variables, then defaults.

Each service declares one frozen dataclass whose fields are made with
`setting()`; `add_flags` turns it into argparse flags and `load_settings`
builds the instance, so every knob is defined, documented and parsed once.
The gRPC services' settings extend `ServiceSettings`, which holds the fields
they share.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar


class _Dataclass(Protocol):
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]


T = TypeVar("T", bound=_Dataclass)

# Defaults of every service's message size limits: requests are text, answers may carry many vectors.
DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_SEND_MESSAGE_BYTES = 64 * 1024 * 1024

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class SettingsError(ValueError):
    """A flag or environment variable that cannot be parsed; names the source."""


def setting(default: Any, *, env: str, help: str) -> Any:
    """A settings field: its default, the environment variable it reads, its help text."""
    if isinstance(default, list):
        raise TypeError("use a tuple for list-valued settings")
    return dataclasses.field(default=default, metadata={"env": env, "help": help})


def port_setting(default: int) -> Any:
    """A service's gRPC port (SIE_PORT), with its own default."""
    return setting(default, env="SIE_PORT", help="gRPC port")


def metrics_port_setting(default: int, *, env: str) -> Any:
    """A service's /metrics port, with its own default and variable (several services share a host)."""
    return setting(
        default, env=env, help="HTTP port serving /metrics (Prometheus), /healthz and /readyz; 0 disables it"
    )


@dataclass(frozen=True)
class ServiceSettings:
    """The fields every gRPC service (worker, gateway, config service) shares: where it listens, etcd, TLS, message
    limits, logging and tracing. Each service's settings extend it and add `port` (`port_setting`) and `metrics_port`
    (`metrics_port_setting`) with their own defaults."""

    host: str = setting("0.0.0.0", env="SIE_HOST", help="address to listen on")
    etcd_endpoints: tuple[str, ...] = setting(
        ("127.0.0.1:2379",), env="SIE_ETCD_ENDPOINTS", help="comma-separated etcd client endpoints (host:port)"
    )
    etcd_prefix: str = setting("/sie/", env="SIE_ETCD_PREFIX", help="prefix of every key the engine keeps in etcd")
    etcd_username: str | None = setting(
        None,
        env="SIE_ETCD_USERNAME",
        help="etcd user this service authenticates as (its role says what it may read and write); unset: no "
        "credential, which an etcd with authentication on refuses",
    )
    etcd_password_file: str | None = setting(
        None,
        env="SIE_ETCD_PASSWORD_FILE",
        help="file holding SIE_ETCD_USERNAME's password (read again whenever the service authenticates)",
    )
    etcd_password: str | None = setting(
        None, env="SIE_ETCD_PASSWORD", help="SIE_ETCD_USERNAME's password itself, instead of SIE_ETCD_PASSWORD_FILE"
    )
    etcd_ca_file: str | None = setting(
        None,
        env="SIE_ETCD_CA_FILE",
        help="PEM CA bundle that signed etcd's certificate: when set, etcd is reached over TLS",
    )
    etcd_cert_file: str | None = setting(
        None,
        env="SIE_ETCD_CERT_FILE",
        help="PEM client certificate presented to etcd (etcd with --client-cert-auth refuses connections without one)",
    )
    etcd_key_file: str | None = setting(None, env="SIE_ETCD_KEY_FILE", help="PEM private key of SIE_ETCD_CERT_FILE")
    tls_cert_file: str | None = setting(
        None,
        env="SIE_TLS_CERT_FILE",
        help="PEM certificate (chain) this server presents; with SIE_TLS_KEY_FILE the gRPC port accepts TLS only",
    )
    tls_key_file: str | None = setting(None, env="SIE_TLS_KEY_FILE", help="PEM private key of SIE_TLS_CERT_FILE")
    tls_client_ca_file: str | None = setting(
        None,
        env="SIE_TLS_CLIENT_CA_FILE",
        help="PEM CA bundle: when set, clients must present a certificate it signed (mutual TLS)",
    )
    max_receive_message_bytes: int = setting(
        DEFAULT_MAX_RECEIVE_MESSAGE_BYTES,
        env="SIE_MAX_RECEIVE_MESSAGE_BYTES",
        help="largest request message accepted; larger ones get RESOURCE_EXHAUSTED",
    )
    max_send_message_bytes: int = setting(
        DEFAULT_MAX_SEND_MESSAGE_BYTES,
        env="SIE_MAX_SEND_MESSAGE_BYTES",
        help="largest response message sent; a larger answer fails with RESOURCE_EXHAUSTED",
    )
    log_level: str = setting("INFO", env="SIE_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR")
    # Observability (docs/observability.md).
    log_json: bool = setting(
        False,
        env="SIE_LOG_JSON",
        help="log one JSON object per line: timestamp, level, logger, message, and model, request_id, trace_id,"
        " latency_ms when known",
    )
    tracing_enabled: bool = setting(
        False,
        env="SIE_TRACING_ENABLED",
        help="export OpenTelemetry traces, set up by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, ...)",
    )

    @property
    def loopback_only(self) -> bool:
        """Whether SIE_HOST is a loopback address (127.0.0.0/8, ::1, localhost): no other machine reaches the port."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def add_flags(parser: argparse.ArgumentParser, settings_type: type) -> None:
    """Add a `--kebab-case` flag per field; unset flags fall back to the environment."""
    hints = typing.get_type_hints(settings_type)
    for field in dataclasses.fields(settings_type):
        flag = "--" + field.name.replace("_", "-")
        help_text = f"{field.metadata['help']} [env {field.metadata['env']}, default {_show(field.default)}]"
        if _base_type(hints[field.name]) is bool:
            parser.add_argument(
                flag, dest=field.name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        else:
            parser.add_argument(flag, dest=field.name, default=None, metavar=field.name.upper(), help=help_text)


def load_settings(
    settings_type: type[T],
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """Build settings: a flag wins over its environment variable, which wins over the default."""
    environ = os.environ if environ is None else environ
    hints = typing.get_type_hints(settings_type)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(settings_type):
        env = field.metadata["env"]
        flag_value = getattr(args, field.name, None) if args is not None else None
        if flag_value is not None:
            source, raw = "--" + field.name.replace("_", "-"), flag_value
        elif environ.get(env, "") != "":
            source, raw = env, environ[env]
        else:
            continue
        values[field.name] = _parse(raw, hints[field.name], source)
    return settings_type(**values)


def _base_type(hint: Any) -> Any:
    """`int | None` -> int; `tuple[str, ...]` -> tuple; plain types unchanged."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        (inner,) = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _base_type(inner)
    return typing.get_origin(hint) or hint


def _parse(raw: Any, hint: Any, source: str) -> Any:
    kind = _base_type(hint)
    if isinstance(raw, bool) or not isinstance(raw, str):
        return raw
    text = raw.strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise ValueError("expected true or false")
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind is tuple:
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return text
    except ValueError as error:
        raise SettingsError(f"{source}={raw!r}: {error}") from None


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(value) or "unset"
    return "unset" if value is None else str(value)
