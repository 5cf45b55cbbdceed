"""Who may read and write what in etcd, and the set-up that makes etcd enforce it.

Each service authenticates to etcd as its own user, whose role (of the same
name) grants only what the service does (docs/control-plane.md has the table):

- the config service writes model configs, bundles, the epoch and its own
  records: the only writer of what workers load;
- gateways read models, bundles and worker registrations, and write pools and
  demand;
- workers read models and bundles and write registrations: all of `workers/`
  (Kubernetes: one user for every replica), or only their own key (`sie up`:
  one user per worker).

`set_up_access` makes etcd so, idempotently: it creates or updates the root
user, the roles and the users, then turns authentication on. It runs before
the services in `sie up`, and as the `sie-etcd-access` Job in Kubernetes:

    SIE_ETCD_ENDPOINTS=... SIE_ETCD_ROOT_PASSWORD=... SIE_ETCD_CONFIG_PASSWORD=... \\
    SIE_ETCD_GATEWAY_PASSWORD=... SIE_ETCD_WORKER_PASSWORD=... python -m sie_common.cluster.etcd_access
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sie_common.cluster.cluster_store import DEMAND, POOLS, WORKERS
from sie_common.cluster.config_store import BUNDLES, CONFIG_SERVICE, EPOCH, MODELS
from sie_common.cluster.etcd import (
    DEFAULT_PREFIX,
    Etcd,
    EtcdAccessDenied,
    EtcdAuthDisabled,
    EtcdCredentials,
    EtcdUnavailable,
    Permission,
)
from sie_common.runtime.settings import SettingsError, load_settings, setting

log = logging.getLogger(__name__)

ROOT_USER = "root"
CONFIG_USER = "sie-config"
GATEWAY_USER = "sie-gateway"
WORKER_USER = "sie-worker"

CONFIG_PERMISSIONS = (
    Permission(MODELS, write=True),
    Permission(BUNDLES, write=True),
    Permission(EPOCH, write=True),
    Permission(CONFIG_SERVICE, write=True),
)
GATEWAY_PERMISSIONS = (
    Permission(MODELS, write=False),
    Permission(BUNDLES, write=False),
    Permission(WORKERS, write=False),
    Permission(POOLS, write=True),
    Permission(DEMAND, write=True),
)


def worker_permissions(worker_id: str | None = None) -> tuple[Permission, ...]:
    """A worker's: read models and bundles; write its own registration (`worker_id`), or any (None)."""
    registration = Permission(WORKERS + worker_id if worker_id else WORKERS, write=True)
    return (Permission(MODELS, write=False), Permission(BUNDLES, write=False), registration)


@dataclass(frozen=True)
class EtcdUser:
    """A service's etcd user: its password and what its role (named as the user) grants."""

    name: str
    password: str
    permissions: tuple[Permission, ...]

    def __repr__(self) -> str:  # never show the password
        return f"EtcdUser(name={self.name!r})"


async def set_up_access(endpoints: Sequence[str], prefix: str, root_password: str, users: Sequence[EtcdUser]) -> None:
    """Make etcd hold exactly these users, each with its own role, and turn authentication on.

    Run again, it changes only what differs (a password, a permission), so it can
    run at every start. Once authentication is on it needs the same root password.
    """
    root = EtcdCredentials(ROOT_USER, password=root_password)
    etcd = Etcd(endpoints, prefix, credentials=root)
    try:
        await etcd.connect()
        enabled = True
    except EtcdAuthDisabled:  # a fresh etcd: anyone may change users and roles until auth is on
        etcd = Etcd(endpoints, prefix)
        await etcd.connect()
        enabled = False
    try:
        await etcd.set_role(ROOT_USER, ())
        await etcd.set_user(ROOT_USER, root_password, [ROOT_USER])
        for user in users:
            await etcd.set_role(user.name, user.permissions)
            await etcd.set_user(user.name, user.password, [user.name])
        if not enabled:
            await etcd.enable_auth()
            log.info("etcd authentication is on")
    finally:
        await etcd.close()


@dataclass(frozen=True)
class AccessSettings:
    """The Kubernetes Job's settings: where etcd is, and each user's password (from Secrets)."""

    etcd_endpoints: tuple[str, ...] = setting(
        ("127.0.0.1:2379",), env="SIE_ETCD_ENDPOINTS", help="comma-separated etcd client endpoints (host:port)"
    )
    etcd_prefix: str = setting(DEFAULT_PREFIX, env="SIE_ETCD_PREFIX", help="prefix the services' keys are under")
    root_password: str = setting("", env="SIE_ETCD_ROOT_PASSWORD", help="password of etcd's root user")
    config_password: str = setting("", env="SIE_ETCD_CONFIG_PASSWORD", help="password of the config service's user")
    gateway_password: str = setting("", env="SIE_ETCD_GATEWAY_PASSWORD", help="password of the gateways' user")
    worker_password: str = setting("", env="SIE_ETCD_WORKER_PASSWORD", help="password of the workers' user")

    def __post_init__(self) -> None:
        missing = [name for name in ("root", "config", "gateway", "worker") if not getattr(self, f"{name}_password")]
        if missing:
            raise SettingsError(
                "set " + ", ".join(f"SIE_ETCD_{name.upper()}_PASSWORD" for name in missing) + " (docs/deployment.md)"
            )

    def users(self) -> list[EtcdUser]:
        return [
            EtcdUser(CONFIG_USER, self.config_password, CONFIG_PERMISSIONS),
            EtcdUser(GATEWAY_USER, self.gateway_password, GATEWAY_PERMISSIONS),
            EtcdUser(WORKER_USER, self.worker_password, worker_permissions()),
        ]


async def _set_up_until_done(settings: AccessSettings, retry_s: float = 2.0) -> None:
    """Retry while etcd is unreachable (its pods may start after this Job's)."""
    while True:
        try:
            return await set_up_access(
                settings.etcd_endpoints, settings.etcd_prefix, settings.root_password, settings.users()
            )
        except EtcdUnavailable as error:
            if isinstance(error, EtcdAccessDenied):
                raise  # a wrong root password stays wrong
            log.warning("%s; retrying in %.0f s", error, retry_s)
            await asyncio.sleep(retry_s)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings(AccessSettings)
    except SettingsError as error:
        log.error("%s", error)
        return 2
    try:
        asyncio.run(_set_up_until_done(settings))
    except EtcdUnavailable as error:
        log.error("%s", error)
        return 1
    log.info("etcd users and roles are set up for prefix %s", settings.etcd_prefix)
    return 0


if __name__ == "__main__":
    sys.exit(main())
