"""The local stack's etcd users: a root password and one user per service, kept in the state dir.

`<state dir>/etcd-credentials/` (mode 0700) holds one password file per etcd
user (mode 0600): `root`, `sie-config`, `sie-gateway`, and `sie-worker-<n>`
for each worker, whose role may write only its own registration. Passwords
are made once and kept, because etcd's data (and its users) outlive a run:
the next `sie up` on the same state dir signs in as root with the same file.
Each service is given its user's name and password file, never the password
itself (SIE_ETCD_USERNAME, SIE_ETCD_PASSWORD_FILE).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

from sie_common.cluster.etcd import EtcdAccessDenied
from sie_common.cluster.etcd_access import (
    CONFIG_PERMISSIONS,
    CONFIG_USER,
    GATEWAY_PERMISSIONS,
    GATEWAY_USER,
    ROOT_USER,
    EtcdUser,
    set_up_access,
    worker_permissions,
)
from sie_stack.processes import EtcdProcess


def worker_user(worker_id: str) -> str:
    """The etcd user of one of the stack's workers."""
    return f"sie-{worker_id}"


class StackEtcdCredentials:
    """The password files of the stack's etcd users, made on first use."""

    def __init__(self, directory: Path, prefix: str, worker_ids: Sequence[str]) -> None:
        self.directory = directory
        self.prefix = prefix
        self.worker_ids = tuple(worker_ids)

    def password_file(self, user: str) -> Path:
        return self.directory / user

    def env(self, user: str) -> dict[str, str]:
        """What a service needs to sign in to etcd as `user`."""
        return {"SIE_ETCD_USERNAME": user, "SIE_ETCD_PASSWORD_FILE": str(self.password_file(user))}

    def set_up(self, etcd: EtcdProcess) -> None:
        """Create the users and roles and turn authentication on, with etcd serving only on its private socket
        (a fresh etcd takes any change to users and roles until authentication is on); leaves it stopped."""
        etcd.start(private=True)
        try:
            asyncio.run(self.apply(etcd.private_endpoint))
        finally:
            etcd.stop()

    async def apply(self, endpoint: str) -> None:
        """Create the users and roles in the etcd at `endpoint` and turn authentication on."""
        users = [
            EtcdUser(CONFIG_USER, self._password(CONFIG_USER), CONFIG_PERMISSIONS),
            EtcdUser(GATEWAY_USER, self._password(GATEWAY_USER), GATEWAY_PERMISSIONS),
            *(
                EtcdUser(worker_user(worker_id), self._password(worker_user(worker_id)), worker_permissions(worker_id))
                for worker_id in self.worker_ids
            ),
        ]
        try:
            await set_up_access([endpoint], self.prefix, self._password(ROOT_USER), users)
        except EtcdAccessDenied as error:
            raise RuntimeError(
                f"{error}. The etcd data in this state dir has authentication on from an earlier run, and "
                f"{self.password_file(ROOT_USER)} no longer holds its root password: restore that file, or delete "
                "the state dir's etcd/ and etcd-credentials/ to start afresh (the models added to it go too)"
            ) from error

    def _password(self, user: str) -> str:
        """The user's password: the one kept from an earlier run, else a new one, written with mode 0600."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        path = self.password_file(user)
        if path.exists():
            os.chmod(path, 0o600)
            return path.read_text().rstrip("\r\n")
        password = secrets.token_urlsafe(24)
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
            file.write(password + "\n")
        return password
