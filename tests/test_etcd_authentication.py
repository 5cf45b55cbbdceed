"""etcd with authentication on (sie_common.cluster.etcd, etcd_access): each service's role, and a client that
outlives its token, on a real etcd.

etcd forgets a token after `--auth-token-ttl` unused (2 s here) and on every
restart; the client must sign in again on its own, and a watch and a lease
keep-alive must go on through both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sie_common.cluster.etcd import Etcd, EtcdAccessDenied, EtcdAuthDisabled, EtcdCredentials, credentials_from
from sie_common.cluster.etcd_access import CONFIG_USER, GATEWAY_USER, ROOT_USER
from sie_common.cluster.etcd_mirror import PrefixMirror
from sie_common.runtime.settings import ServiceSettings, SettingsError, load_settings
from sie_stack.etcd_credentials import StackEtcdCredentials, worker_user
from sie_stack.processes import EtcdProcess

# Starts processes (etcds with authentication of their own) in fixtures of its own.
pytestmark = pytest.mark.process

PREFIX = "/sie/"
TOKEN_TTL_S = 2
WORKER = worker_user("worker-0")


class AuthEtcd:
    """A real etcd whose users and roles are set up as `sie up` sets them (one worker, worker-0)."""

    def __init__(self, tmp: Path) -> None:
        self.server = EtcdProcess(tmp / "etcd", tmp / "etcd.log", auth_token_ttl_s=TOKEN_TTL_S)
        self.users = StackEtcdCredentials(tmp / "credentials", PREFIX, ["worker-0"])
        self.users.set_up(self.server)
        self.server.start()

    def credentials(self, user: str) -> EtcdCredentials:
        return EtcdCredentials(user, password_file=str(self.users.password_file(user)))

    async def client(self, user: str | None) -> Etcd:
        etcd = Etcd([self.server.endpoint], PREFIX, credentials=self.credentials(user) if user else None)
        await etcd.connect()
        return etcd


@pytest.fixture(scope="module")
def auth_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthEtcd]:
    running = AuthEtcd(tmp_path_factory.mktemp("auth-etcd"))
    yield running
    running.server.stop()


@pytest.fixture
async def root(auth_etcd: AuthEtcd) -> AsyncIterator[Etcd]:
    etcd = await auth_etcd.client(ROOT_USER)
    yield etcd
    await etcd.close()


async def stored(root: Etcd) -> dict[str, bytes]:
    entries, _ = await root.read_prefix("")
    return {entry.name: entry.value for entry in entries}


# Which names each service's role may write; everything else it is refused.
WRITES = {
    CONFIG_USER: {"models/m", "bundles/b", "epoch", "config/leader", "config/idempotency/k"},
    GATEWAY_USER: {"pools/p", "demand/default"},
    WORKER: {"workers/worker-0"},
}
NAMES = sorted({name for names in WRITES.values() for name in names} | {"workers/forged", "workers/worker-00"})


@pytest.mark.parametrize("user", sorted(WRITES))
async def test_each_role_writes_only_its_own_names_and_a_refused_write_leaves_etcd_unchanged(
    auth_etcd: AuthEtcd, root: Etcd, user: str
) -> None:
    etcd = await auth_etcd.client(user)
    try:
        for name in NAMES:
            await root.delete(name)
            before = await stored(root)
            try:
                await etcd.put(name, b"written by " + user.encode())
                written = True
            except EtcdAccessDenied as error:
                assert f"permission denied for etcd user {user!r}" in str(error)
                written = False
            assert written == (name in WRITES[user]), f"{user} writing {name}"
            after = await stored(root)
            if written:
                assert after == {**before, name: b"written by " + user.encode()}
            else:
                assert after == before
    finally:
        await etcd.close()
        for name in NAMES:
            await root.delete(name)


async def test_gateways_read_workers_and_models_but_workers_do_not_read_pools(auth_etcd: AuthEtcd, root: Etcd) -> None:
    await root.put("workers/worker-0", b"w")
    await root.put("pools/p", b"p")
    gateway, worker = await auth_etcd.client(GATEWAY_USER), await auth_etcd.client(WORKER)
    try:
        assert [e.name for e in (await gateway.read_prefix("workers/"))[0]] == ["workers/worker-0"]
        await gateway.read_prefix("models/")
        await worker.read_prefix("models/")
        with pytest.raises(EtcdAccessDenied):
            await worker.read_prefix("pools/")
        with pytest.raises(EtcdAccessDenied):
            await worker.read_prefix("workers/")
        with pytest.raises(EtcdAccessDenied):  # nor may it watch what it may not read
            async for _ in worker.watch("pools/", 1):
                pass
    finally:
        await gateway.close()
        await worker.close()
        await root.delete("workers/worker-0")
        await root.delete("pools/p")


async def test_without_a_credential_etcd_refuses_everything_and_says_what_to_set(auth_etcd: AuthEtcd) -> None:
    with pytest.raises(EtcdAccessDenied) as refused:
        await auth_etcd.client(None)
    assert "has authentication on and this client has no credential" in str(refused.value)
    assert "SIE_ETCD_USERNAME" in str(refused.value)
    wrong = Etcd([auth_etcd.server.endpoint], PREFIX, credentials=EtcdCredentials(GATEWAY_USER, password="guess"))
    with pytest.raises(EtcdAccessDenied) as refused:
        await wrong.connect()
    assert f"wrong password for etcd user {GATEWAY_USER!r}" in str(refused.value)
    assert "guess" not in str(refused.value) and "guess" not in repr(wrong.credentials)


async def test_a_credential_against_an_etcd_without_authentication_is_refused(etcd_server: EtcdProcess) -> None:
    """A service given a credential counts on etcd checking everyone's; an open etcd must not pass for that."""
    etcd = Etcd([etcd_server.endpoint], PREFIX, credentials=EtcdCredentials(GATEWAY_USER, password="x"))
    with pytest.raises(EtcdAuthDisabled) as refused:
        await etcd.connect()
    assert "etcd has authentication off" in str(refused.value)


async def test_a_watch_and_a_lease_outlive_token_expiry_and_an_etcd_restart(auth_etcd: AuthEtcd, root: Etcd) -> None:
    gateway, worker = await auth_etcd.client(GATEWAY_USER), await auth_etcd.client(WORKER)
    mirror = PrefixMirror(gateway, "workers/", retry_s=0.2)
    try:
        lease = await worker.grant_lease(5)
        await mirror.start()
        await mirror.wait_for(await worker.put("workers/worker-0", b"1", lease=lease), timeout_s=10)
        invalid_before = auth_etcd.server.log().count("invalid auth token")

        await asyncio.sleep(TOKEN_TTL_S + 2)  # both clients' tokens expire unused
        assert await worker.keep_alive(lease) > 0
        written = await worker.put("workers/worker-0", b"2", lease=lease)
        await mirror.wait_for(written, timeout_s=10)
        assert mirror.state == {"worker-0": b"2"}

        auth_etcd.server.stop()  # etcd forgets every token; the watch stream breaks
        auth_etcd.server.start()
        assert await worker.keep_alive(lease) > 0  # the lease survived the restart
        written = await worker.put("workers/worker-0", b"3", lease=lease)
        await mirror.wait_for(written, timeout_s=30)
        assert (
            mirror.state
            == {"worker-0": b"3"}
            == {e.name.removeprefix("workers/"): e.value for e in (await root.read_prefix("workers/"))[0]}
        )
        assert mirror.full_reads == 1  # resumed from its revision each time, never re-read
        # etcd refused the stale tokens at least once: the clients signed in again, nobody was refused for good.
        assert auth_etcd.server.log().count("invalid auth token") > invalid_before
    finally:
        await mirror.stop()
        await root.delete("workers/worker-0")
        await gateway.close()
        await worker.close()


async def test_a_rotated_password_file_is_read_when_the_client_signs_in_again(
    auth_etcd: AuthEtcd, tmp_path: Path
) -> None:
    password_file = tmp_path / "gateway-password"
    password_file.write_text(auth_etcd.users.password_file(GATEWAY_USER).read_text())
    gateway = Etcd(
        [auth_etcd.server.endpoint], PREFIX, credentials=EtcdCredentials(GATEWAY_USER, password_file=str(password_file))
    )
    await gateway.connect()
    try:
        password_file.write_text("rotated-password\n")
        root = await auth_etcd.client(ROOT_USER)
        try:  # what an operator does: change the password, then the file; etcd ends the user's tokens
            await root.set_user(GATEWAY_USER, "rotated-password", [GATEWAY_USER])
            assert (await gateway.read_prefix("models/"))[0] == []
        finally:
            await root.set_user(
                GATEWAY_USER, auth_etcd.users.password_file(GATEWAY_USER).read_text().strip(), [GATEWAY_USER]
            )
            await root.close()
    finally:
        await gateway.close()


async def test_setting_up_access_again_changes_nothing_and_keeps_clients_signed_in(auth_etcd: AuthEtcd) -> None:
    gateway = await auth_etcd.client(GATEWAY_USER)
    try:
        invalid_before = auth_etcd.server.log().count("invalid auth token")
        await auth_etcd.users.apply(auth_etcd.server.endpoint)
        await gateway.read_prefix("models/")
        assert auth_etcd.server.log().count("invalid auth token") == invalid_before  # its token was not ended
    finally:
        await gateway.close()


def test_credential_settings_come_whole_or_not_at_all() -> None:
    def credential(**env: str) -> EtcdCredentials | None:
        return credentials_from(load_settings(ServiceSettings, environ=env))

    assert credential() is None
    assert credential(SIE_ETCD_USERNAME="u", SIE_ETCD_PASSWORD_FILE="/p") == EtcdCredentials("u", password_file="/p")
    for env, message in [
        ({"SIE_ETCD_PASSWORD": "p"}, "need SIE_ETCD_USERNAME"),
        ({"SIE_ETCD_USERNAME": "u"}, "exactly one of SIE_ETCD_PASSWORD and SIE_ETCD_PASSWORD_FILE"),
        ({"SIE_ETCD_USERNAME": "u", "SIE_ETCD_PASSWORD": "p", "SIE_ETCD_PASSWORD_FILE": "/p"}, "exactly one of"),
    ]:
        with pytest.raises(SettingsError, match=message):
            credential(**env)


async def test_a_state_dir_that_lost_its_root_password_says_how_to_recover(auth_etcd: AuthEtcd, tmp_path: Path) -> None:
    """`sie up` on etcd data with authentication on, but password files that are not its own (deleted, replaced)."""
    other = StackEtcdCredentials(tmp_path / "credentials", PREFIX, ["worker-0"])
    with pytest.raises(RuntimeError) as refused:
        await other.apply(auth_etcd.server.endpoint)
    message = str(refused.value)
    assert "wrong password for etcd user 'root'" in message
    assert str(other.password_file(ROOT_USER)) in message and "delete the state dir's etcd/" in message
    root = await auth_etcd.client(ROOT_USER)  # nothing changed: the stack's own users still sign in
    await root.close()
    gateway = await auth_etcd.client(GATEWAY_USER)
    await gateway.close()


def test_users_are_set_up_before_etcd_listens_on_its_port(tmp_path: Path) -> None:
    """A fresh etcd lets anyone add users and roles until authentication is on (a local user could make itself
    root): `sie up` sets them up while etcd serves only a Unix socket in a directory of its own."""
    from sie_stack.processes import port_in_use

    seen = {}

    class Watched(StackEtcdCredentials):
        async def apply(self, endpoint: str) -> None:
            private_dir = Path(endpoint.removeprefix("unix:")).parent
            seen["port"], seen["mode"] = port_in_use(server.client_port), private_dir.stat().st_mode & 0o777
            await super().apply(endpoint)

    server = EtcdProcess(tmp_path / "etcd", tmp_path / "etcd.log")
    Watched(tmp_path / "credentials", PREFIX, ["worker-0"]).set_up(server)
    assert seen == {"port": False, "mode": 0o700}
    assert not port_in_use(server.client_port) and server.process is None  # left stopped
    server.start()
    try:
        assert (
            anonymous_read(server.endpoint) == "etcdserver: user name is empty"
        )  # authentication is on from the first request
    finally:
        server.stop()


def anonymous_read(endpoint: str) -> str:
    """What etcd answers a read without a token."""
    import grpc
    from aetcd import rpc

    with grpc.insecure_channel(endpoint) as channel:
        try:
            rpc.KVStub(channel).Range(rpc.RangeRequest(key=b"/sie/"), timeout=10)
        except grpc.RpcError as error:
            return error.details() or ""
    return "answered"


async def test_an_etcd_with_client_certificate_auth_takes_only_clients_with_its_certificate(tmp_path: Path) -> None:
    """`sie up`'s etcd: TLS with `--client-cert-auth`, then its users."""
    from sie_common.cluster.etcd import EtcdTls, EtcdUnavailable
    from sie_stack.etcd_tls import StackEtcdTls

    tls = StackEtcdTls(tmp_path / "tls")
    tls.create()
    server = EtcdProcess(tmp_path / "etcd", tmp_path / "etcd.log", tls=tls)
    users = StackEtcdCredentials(tmp_path / "credentials", PREFIX, ["worker-0"])
    server.start(private=True)  # what users.set_up(server) does, in this test's event loop
    await users.apply(server.private_endpoint)
    server.stop()
    server.start()
    try:
        client_tls = EtcdTls(str(tls.ca), str(tls.client_cert), str(tls.client_key))
        gateway = EtcdCredentials(GATEWAY_USER, password_file=str(users.password_file(GATEWAY_USER)))
        for refused in (
            Etcd([server.endpoint], PREFIX, credentials=gateway),  # plaintext
            Etcd([server.endpoint], PREFIX, credentials=gateway, tls=EtcdTls(str(tls.ca))),  # no client certificate
        ):
            with pytest.raises(EtcdUnavailable) as raised:
                await refused.connect()
            assert not isinstance(raised.value, EtcdAccessDenied), "refused before any credential is looked at"
        anonymous = Etcd([server.endpoint], PREFIX, tls=client_tls)
        with pytest.raises(EtcdAccessDenied, match="no credential"):  # the certificate alone is no etcd user
            await anonymous.connect()
        etcd = Etcd([server.endpoint], PREFIX, credentials=gateway, tls=client_tls)
        await etcd.connect()
        try:
            await etcd.put("pools/p", b"x")
            assert [entry.name for entry in (await etcd.read_prefix("pools/"))[0]] == ["pools/p"]
        finally:
            await etcd.close()
    finally:
        server.stop()
