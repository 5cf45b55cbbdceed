"""Every knob of `sie up`, in one typed object (flags > SIE_* env > defaults)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from sie_common.cluster.etcd import DEFAULT_PREFIX
from sie_common.edge.auth import check_auth_mode
from sie_common.runtime.settings import setting


@dataclass(frozen=True)
class StackSettings:
    state_dir: str = setting(
        ".sie", env="SIE_STATE_DIR", help="directory for etcd's data, the rendered Envoy config and every process's log"
    )
    workers: int = setting(1, env="SIE_STACK_WORKERS", help="how many workers to start")
    etcd_port: int = setting(2379, env="SIE_STACK_ETCD_PORT", help="etcd client port")
    etcd_prefix: str = setting(
        DEFAULT_PREFIX, env="SIE_ETCD_PREFIX", help="prefix of the stack's keys in etcd (its etcd roles grant this one)"
    )
    config_port: int = setting(50071, env="SIE_STACK_CONFIG_PORT", help="config service gRPC port")
    worker_port: int = setting(
        50061, env="SIE_STACK_WORKER_PORT", help="first worker's gRPC port; the others take the next ones"
    )
    gateway_port: int = setting(50051, env="SIE_STACK_GATEWAY_PORT", help="gateway gRPC port")
    http_port: int = setting(8080, env="SIE_STACK_HTTP_PORT", help="Envoy port: HTTP/JSON and native gRPC")
    envoy_admin_port: int = setting(9901, env="SIE_STACK_ENVOY_ADMIN_PORT", help="Envoy admin port (readiness, stats)")
    http_adapter_port: int = setting(
        0,
        env="SIE_STACK_HTTP_ADAPTER_PORT",
        help="the gateway's HTTP adapter port, behind Envoy (the reference SDK's wire, rerank, TEI); 0: a free one",
    )
    images: bool = setting(
        False,
        env="SIE_STACK_IMAGES",
        help="run the config service, the workers, the gateway and Envoy from their images (`make images`), each a "
        "container on the host's network; etcd stays a process",
    )
    container_engine: str | None = setting(
        None, env="SIE_CONTAINER_ENGINE", help="with --images: podman or docker (unset: podman, else docker)"
    )
    log_level: str = setting("INFO", env="SIE_LOG_LEVEL", help="DEBUG, INFO, WARNING or ERROR")
    admin_token: str | None = setting(
        None,
        env="SIE_ADMIN_TOKEN",
        help="admin token of the config service; unset: a random one for this session, printed and kept in <state "
        "dir>/admin-token",
    )
    auth_mode: str = setting(
        "none",
        env="SIE_AUTH_MODE",
        help="none, or static: the gateway and workers need a bearer token from SIE_AUTH_TOKENS on every Inference "
        "call",
    )
    auth_tokens: tuple[str, ...] = setting(
        (), env="SIE_AUTH_TOKENS", help="comma-separated inference tokens with SIE_AUTH_MODE=static"
    )

    def __post_init__(self) -> None:
        check_auth_mode(self.auth_mode, self.auth_tokens)

    def ports(self) -> dict[int, str]:
        """Each port the stack binds on 127.0.0.1 -> what takes it and how to move it."""
        moves = {field.name: f"--{field.name.replace('_', '-')} / {field.metadata['env']}" for field in fields(self)}
        return {
            self.etcd_port: f"etcd [{moves['etcd_port']}]",
            self.config_port: f"config service [{moves['config_port']}]",
            **{
                self.worker_port + i: f"worker-{i} [{moves['worker_port']}{f' + {i}' if i else ''}]"
                for i in range(self.workers)
            },
            self.gateway_port: f"gateway [{moves['gateway_port']}]",
            self.http_port: f"Envoy [{moves['http_port']}]",
            self.envoy_admin_port: f"Envoy admin [{moves['envoy_admin_port']}]",
            **(
                {self.http_adapter_port: f"HTTP adapter [{moves['http_adapter_port']}]"}
                if self.http_adapter_port
                else {}
            ),
        }
