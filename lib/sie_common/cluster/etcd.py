"""The engine's one door to etcd v3: reads at a revision, guarded transactions, leases, watches, users and roles.

Speaks etcd's gRPC API through the stubs `aetcd` ships, and builds transaction
comparisons with aetcd's helpers. Every key is a name under one prefix
(`SIE_ETCD_PREFIX`, default `/sie/`); the layout, and which service's etcd
role may read and write which names, are in docs/control-plane.md.

**Authentication.** With `EtcdCredentials` the client authenticates as that
etcd user and sends the token etcd hands back on every call. etcd forgets its
tokens: after `--auth-token-ttl` without use (simple tokens, 300 s by default)
and on every restart. A call refused for an expired token is authenticated
again and sent once more; a watch that etcd cancels at creation for one (etcd
says "permission denied" then) is opened again with a fresh token. Watches
already open and lease keep-alives are not checked against the token, so they
outlive it. A password file is read again on each authentication, so a rotated
password is picked up without a restart.

**TLS.** With `EtcdTls` the client speaks TLS to etcd and presents a client
certificate (`sie up`'s etcd refuses connections without one).

**Failing over between endpoints.** `endpoints` may name several members of one
cluster. The client talks to one at a time. A call that fails as if that member
were gone (UNAVAILABLE: refused, reset, or cut off from the cluster's leader;
DEADLINE_EXCEEDED: stalled) drops the connection, and the next call or watch
connects to the next endpoint that answers, in turn. A read or lease keep-alive
is tried once more at once on the next endpoint (it changes nothing); a write is
not (it may have been applied), its caller sees `EtcdUnavailable` and retries.
Watches ask etcd to end them when their member loses the leader (etcd's
`hasleader` metadata), and ask for a progress notification every
`WATCH_PROBE_S` (a watch with no answer a call timeout later drops the
connection), so neither a member cut off from the others nor a frozen one
leaves a watch silent; a broken watch raises `EtcdUnavailable`, and the caller opens it
again from the revision after the last one it saw (`PrefixMirror` does), on
whichever member answers: every member serves the same history, so no event is
missed or seen twice. (Before, a connection stayed on the first endpoint that
answered: when that member died, gateways stopped seeing workers and configs
and the config service stopped writing, though the other members served.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import aetcd.client
import aetcd.transactions
import grpc
from aetcd import rpc
from aetcd.utils import lease_to_id, prefix_range_end

from sie_common.runtime.settings import SettingsError
from sie_common.runtime.transport import RECONNECT_OPTIONS, channel_credentials

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "/sie/"
T = TypeVar("T")
Metadata = tuple[tuple[str, str], ...]

# What etcd says when a token it issued is no longer valid (expired, etcd restarted, or the auth store
# changed since it was issued): authenticate again and retry.
_STALE_TOKEN = ("invalid auth token", "revision of auth store is old", "auth token is expired")
# What etcd says to a call without a token while authentication is on.
_NO_USER = "user name is empty"
# etcd's cancel reason for a watch it refused: a stale token, or a role that may not read the range.
_WATCH_REFUSED = "permission denied"
# Codes that say the member this client talks to is gone, stalled or cut off: the next call goes to the next endpoint.
_MEMBER_LOST = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Asks etcd to end a watch with UNAVAILABLE when its member has no leader (etcd's rpctypes.MetadataRequireLeaderKey).
_REQUIRE_LEADER: Metadata = (("hasleader", "true"),)
# A watch asks for a progress notification this often; one that gets no answer within a call timeout after that
# finds its member stalled (a frozen process, a link that drops packets: nothing else would end it).
WATCH_PROBE_S = 5.0


class EtcdUnavailable(ConnectionError):
    """etcd could not be reached or answered with an error; callers retry."""


class EtcdAccessDenied(EtcdUnavailable):
    """etcd refused this client: no credential while etcd has authentication on, a wrong password, a credential
    while etcd has it off, or a role that may not read or write the key. Retrying helps only once an operator has
    fixed the credential or the role, so callers that retry EtcdUnavailable keep retrying."""


class EtcdAuthDisabled(EtcdAccessDenied):
    """A credential was given, but etcd has authentication off (anyone may read and write)."""


class Compacted(Exception):
    """The revision a watch should resume from was compacted: read everything again."""

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"etcd history compacted up to revision {compact_revision}")
        self.compact_revision = compact_revision


@dataclass(frozen=True)
class Entry:
    """One key as read: its name under the prefix, value and revisions."""

    name: str
    value: bytes
    mod_revision: int
    create_revision: int


@dataclass(frozen=True)
class Change:
    """One watched change: `value` None means the key was deleted."""

    name: str
    value: bytes | None
    revision: int


@dataclass(frozen=True)
class WatchBatch:
    """The changes etcd sent together (empty on progress notifications); `revision`: all up to it are seen."""

    revision: int
    changes: tuple[Change, ...]


@dataclass(frozen=True)
class EtcdCredentials:
    """An etcd user and its password, given as such or as a file holding it (read at each authentication)."""

    username: str
    password: str | None = None
    password_file: str | None = None

    def __post_init__(self) -> None:
        if not self.username:
            raise SettingsError("an etcd credential needs a user name (SIE_ETCD_USERNAME)")
        if (self.password is None) == (self.password_file is None):
            raise SettingsError(
                f"etcd user {self.username!r} needs exactly one of SIE_ETCD_PASSWORD and SIE_ETCD_PASSWORD_FILE"
            )

    def read_password(self) -> str:
        if self.password is not None:
            return self.password
        assert self.password_file is not None
        try:
            return Path(self.password_file).read_text().rstrip("\r\n")
        except OSError as error:
            raise EtcdAccessDenied(f"cannot read SIE_ETCD_PASSWORD_FILE {self.password_file}: {error}") from error

    def __repr__(self) -> str:  # never show the password
        return f"EtcdCredentials(username={self.username!r})"


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd: the CA that signed etcd's certificate, and the client certificate and key to present (etcd's
    `--client-cert-auth` refuses connections without one)."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        return channel_credentials(self.ca_file, self.cert_file, self.key_file)


class EtcdSettings(Protocol):
    """The fields of a service's settings that say how it reaches etcd (`ServiceSettings`)."""

    @property
    def etcd_endpoints(self) -> tuple[str, ...]: ...
    @property
    def etcd_prefix(self) -> str: ...
    @property
    def etcd_username(self) -> str | None: ...
    @property
    def etcd_password(self) -> str | None: ...
    @property
    def etcd_password_file(self) -> str | None: ...
    @property
    def etcd_ca_file(self) -> str | None: ...
    @property
    def etcd_cert_file(self) -> str | None: ...
    @property
    def etcd_key_file(self) -> str | None: ...


def credentials_from(settings: EtcdSettings) -> EtcdCredentials | None:
    """The credential the settings give (None: connect without one); SettingsError for half of one."""
    if not (settings.etcd_username or settings.etcd_password or settings.etcd_password_file):
        return None
    if not settings.etcd_username:
        raise SettingsError("SIE_ETCD_PASSWORD / SIE_ETCD_PASSWORD_FILE need SIE_ETCD_USERNAME")
    return EtcdCredentials(settings.etcd_username, settings.etcd_password or None, settings.etcd_password_file or None)


def tls_from(settings: EtcdSettings) -> EtcdTls | None:
    """TLS to etcd when the settings name its CA (None: plaintext); SettingsError for a client certificate
    without a CA."""
    if not settings.etcd_ca_file:
        if settings.etcd_cert_file or settings.etcd_key_file:
            raise SettingsError("SIE_ETCD_CERT_FILE / SIE_ETCD_KEY_FILE (TLS to etcd) need SIE_ETCD_CA_FILE")
        return None
    return EtcdTls(settings.etcd_ca_file, settings.etcd_cert_file or None, settings.etcd_key_file or None)


@dataclass(frozen=True)
class Permission:
    """A role's right on one name under the prefix (a name ending in `/`: every key under it)."""

    name: str
    write: bool


class _Stubs:
    """The etcd gRPC services on one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)
        self.auth = rpc.AuthStub(channel)


_OPS = aetcd.client.Transactions()


class _LeaseOf(aetcd.transactions.BaseCompare):
    """Compares the lease a key is attached to (aetcd has no builder for it)."""

    def build_compare(self, compare: rpc.Compare) -> None:
        compare.target = rpc.Compare.LEASE
        compare.lease = int(self.value)


class Etcd:
    """A connection to etcd whose keys are names under `prefix`, authenticated with `credentials` when given."""

    def __init__(
        self,
        endpoints: Sequence[str],
        prefix: str = DEFAULT_PREFIX,
        *,
        credentials: EtcdCredentials | None = None,
        tls: EtcdTls | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoints given (SIE_ETCD_ENDPOINTS)")
        self.endpoints = tuple(endpoints)
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.credentials = credentials
        self.tls = tls
        self._timeout_s = timeout_s
        self._stubs: _Stubs | None = None
        # The endpoint the connection is (or last was) on: after a failure the next connection tries the one after.
        self._endpoint = len(self.endpoints) - 1
        self._closed = False
        # Connections dropped after a failure, each closing once its calls ended (a call timeout later at most).
        self._retired: dict[grpc.aio.Channel, asyncio.Task[None]] = {}
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        self._connect_lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, settings: EtcdSettings) -> Etcd:
        """The client a service's settings describe: endpoints, prefix, credential and TLS."""
        return cls(
            settings.etcd_endpoints,
            settings.etcd_prefix,
            credentials=credentials_from(settings),
            tls=tls_from(settings),
        )

    async def connect(self) -> None:
        """Connect to the first endpoint that answers, in turn from the one after the last used (authenticating
        first, with a credential). Calls connect by themselves when they need to; this connects now."""
        self._closed = False
        if self._stubs is not None:
            return
        errors = []
        count = len(self.endpoints)
        for step in range(1, count + 1):
            index = (self._endpoint + step) % count
            endpoint = self.endpoints[index]
            stubs = _Stubs(self._channel(endpoint.removeprefix("http://").removeprefix("https://")))
            try:
                # Signing in shows that etcd answers; without a credential, a read that any client may make.
                if self.credentials:
                    self._token = await self._authenticate(stubs)
                else:
                    probe = rpc.RangeRequest(key=b"\0", count_only=True)
                    await stubs.kv.Range(probe, timeout=self._timeout_s)
            except grpc.aio.AioRpcError as error:
                await stubs.channel.close()
                failure = self._failure(error, "connecting")
                if isinstance(failure, EtcdAccessDenied):
                    raise failure from error  # another endpoint of the same cluster would refuse the same
                errors.append(f"{endpoint}: {error.details()}")
                continue
            except BaseException:
                await stubs.channel.close()
                raise
            self._stubs, self._endpoint = stubs, index
            return
        raise EtcdUnavailable("cannot reach etcd at " + "; ".join(errors))

    def _channel(self, target: str) -> grpc.aio.Channel:
        options = RECONNECT_OPTIONS.items()
        if self.tls is None:
            return rpc.insecure_channel(target, options=options)
        return rpc.secure_channel(target, self.tls.credentials(), options=options)

    async def close(self) -> None:
        self._closed = True
        retired, self._retired = self._retired, {}
        for task in retired.values():
            task.cancel()
        channels = [*retired, *([self._stubs.channel] if self._stubs is not None else [])]
        self._stubs = None
        for channel in channels:
            await channel.close()

    async def _live(self) -> _Stubs:
        """The connection calls go on: connecting (to the next endpoint that answers) if the last one failed."""
        if self._stubs is None:
            if self._closed:
                raise EtcdUnavailable("not connected to etcd (the client was closed)")
            async with self._connect_lock:
                if self._stubs is None:
                    await self.connect()
        assert self._stubs is not None
        return self._stubs

    def _member_lost(self, stubs: _Stubs, error: grpc.aio.AioRpcError) -> bool:
        """Whether `error` says the member behind `stubs` is gone or stalled; if so, drop that connection so that
        the next call goes to the next endpoint."""
        if error.code() not in _MEMBER_LOST:
            return False
        self._drop(stubs, f"{error.code().name} {error.details()}")
        return True

    def _drop(self, stubs: _Stubs, why: str) -> None:
        """Stop using the connection `stubs` (if still in use): the next call connects to the next endpoint."""
        if self._stubs is stubs:
            self._stubs = None
            log.warning(
                "etcd at %s failed (%s); the next call goes to the next endpoint", self.endpoints[self._endpoint], why
            )
            self._retired[stubs.channel] = asyncio.get_running_loop().create_task(self._retire(stubs.channel))

    async def _retire(self, channel: grpc.aio.Channel) -> None:
        """Close a dropped connection once the calls still on it end, at most a call timeout later."""
        try:
            await channel.close(grace=self._timeout_s)
        finally:
            self._retired.pop(channel, None)

    @property
    def ops(self) -> aetcd.client.Transactions:
        """Comparison and operation builders for `txn` (value, version, create, mod, put, delete)."""
        return _OPS

    def key(self, name: str) -> bytes:
        return (self.prefix + name).encode()

    def unchanged_since(self, name_prefix: str, revision: int) -> aetcd.transactions.Mod:
        """A `txn` comparison that holds while no key under `name_prefix` was written after `revision`."""
        key = self.key(name_prefix)
        return self.ops.mod(key, prefix_range_end(key)) < revision + 1

    def held_by(self, name: str, lease: int) -> aetcd.transactions.BaseCompare:
        """A `txn` comparison that holds while the key was last written under `lease` (and exists)."""
        return _LeaseOf(self.key(name)) == lease

    def _name(self, key: bytes) -> str:
        return key.decode()[len(self.prefix) :]

    # -- authentication ------------------------------------------------------------------------

    def _metadata(self) -> Metadata:
        return (("token", self._token),) if self._token else ()

    async def _authenticate(self, stubs: _Stubs) -> str:
        assert self.credentials is not None
        request = rpc.AuthenticateRequest(name=self.credentials.username, password=self.credentials.read_password())
        reply = await stubs.auth.Authenticate(request, timeout=self._timeout_s)
        return reply.token

    async def _renew_token(self, stale: str | None) -> None:
        """Authenticate again, unless another call already replaced the `stale` token."""
        async with self._auth_lock:
            if self._token != stale:
                return
            stubs = await self._live()
            try:
                self._token = await self._authenticate(stubs)
            except grpc.aio.AioRpcError as error:
                self._member_lost(stubs, error)
                raise self._failure(error, "authenticating again") from error
            log.info("authenticated to etcd again as %s", self.credentials.username if self.credentials else "?")

    def _token_is_stale(self, error: grpc.aio.AioRpcError) -> bool:
        return self.credentials is not None and any(reason in (error.details() or "") for reason in _STALE_TOKEN)

    async def _call(
        self, what: str, invoke: Callable[[_Stubs, Metadata], Awaitable[T]], *, changes_nothing: bool = False
    ) -> T:
        """One etcd call with the current token; once more with a fresh token if etcd says it went stale. A call that
        `changes_nothing` is sent once more at once to the next endpoint if its member was lost."""
        stubs, token = await self._live(), self._token
        try:
            return await invoke(stubs, self._metadata())
        except grpc.aio.AioRpcError as error:
            if self._member_lost(stubs, error) and changes_nothing and len(self.endpoints) > 1:
                log.info("etcd: %s again on the next endpoint", what)
                return await self._call(what, invoke)
            if not self._token_is_stale(error):
                raise self._failure(error, what) from error
        await self._renew_token(token)
        stubs = await self._live()
        try:
            return await invoke(stubs, self._metadata())
        except grpc.aio.AioRpcError as error:
            self._member_lost(stubs, error)
            raise self._failure(error, what) from error

    def _failure(self, error: grpc.aio.AioRpcError, what: str) -> EtcdUnavailable:
        """The exception a failed call becomes: access refusals name the credential to fix."""
        details = error.details() or ""
        user = self.credentials.username if self.credentials else None
        # Without a token etcd may take the name in the client certificate as the user, and refuse that one.
        if _NO_USER in details or (user is None and error.code() == grpc.StatusCode.PERMISSION_DENIED):
            return EtcdAccessDenied(
                f"etcd refused {what}: it has authentication on and this client has no credential (set "
                "SIE_ETCD_USERNAME and SIE_ETCD_PASSWORD_FILE or SIE_ETCD_PASSWORD)"
            )
        if "authentication failed" in details:
            return EtcdAccessDenied(f"etcd refused {what}: wrong password for etcd user {user!r}")
        if "authentication is not enabled" in details:
            return EtcdAuthDisabled(
                f"etcd refused {what}: a credential was given (etcd user {user!r}) but etcd has authentication off; "
                "turn it on (sie up and the Kubernetes base do), or unset SIE_ETCD_USERNAME"
            )
        if error.code() == grpc.StatusCode.PERMISSION_DENIED:
            return EtcdAccessDenied(
                f"etcd refused {what}: permission denied for etcd user {user!r} (docs/control-plane.md lists what each "
                "service's role may read and write)"
            )
        return EtcdUnavailable(f"etcd {what} failed: {error.code().name} {details}")

    # -- keys ------------------------------------------------------------------------------------

    async def get(self, name: str, revision: int = 0) -> Entry | None:
        """One key as of `revision` (0: now)."""
        entries, _ = await self._range(self.key(name), None, revision)
        return entries[0] if entries else None

    async def get_now(self, name: str) -> tuple[Entry | None, int]:
        """One key as of now, and the revision it was read at (to watch it from the next one)."""
        entries, revision = await self._range(self.key(name), None, 0)
        return (entries[0] if entries else None), revision

    async def read_prefix(self, name_prefix: str, revision: int = 0) -> tuple[list[Entry], int]:
        """Every key under `name_prefix` as of `revision` (0: now), and the revision read at."""
        key = self.key(name_prefix)
        return await self._range(key, prefix_range_end(key), revision)

    async def _range(self, key: bytes, range_end: bytes | None, revision: int) -> tuple[list[Entry], int]:
        request = rpc.RangeRequest(key=key, range_end=range_end or b"", revision=revision)
        try:
            reply = await self._call(
                f"reading {key.decode()!r}",
                lambda stubs, metadata: stubs.kv.Range(request, timeout=self._timeout_s, metadata=metadata),
                changes_nothing=True,
            )
        except EtcdUnavailable as error:
            if "compacted" in str(error):
                raise Compacted(revision) from error
            raise
        entries = [Entry(self._name(kv.key), kv.value, kv.mod_revision, kv.create_revision) for kv in reply.kvs]
        return entries, reply.header.revision

    async def txn(self, compare: list, success: list, failure: list | None = None) -> tuple[bool, int]:
        """Apply `success` if every comparison holds (else `failure`); returns (succeeded, revision after)."""
        request = rpc.TxnRequest(
            compare=[c.build_message() for c in compare],
            success=[_request_op(op) for op in success],
            failure=[_request_op(op) for op in failure or []],
        )
        reply = await self._call(
            "a transaction", lambda stubs, metadata: stubs.kv.Txn(request, timeout=self._timeout_s, metadata=metadata)
        )
        return reply.succeeded, reply.header.revision

    async def put(self, name: str, value: bytes, lease: int = 0) -> int:
        """Write one key unconditionally; returns the revision of the write."""
        _, revision = await self.txn([], [self.ops.put(self.key(name), value, lease=lease)])
        return revision

    async def delete(self, name: str) -> int:
        """Delete one key; returns the revision after."""
        _, revision = await self.txn([], [self.ops.delete(self.key(name))])
        return revision

    async def compact(self, revision: int) -> None:
        request = rpc.CompactionRequest(revision=revision, physical=True)
        await self._call(
            "compacting", lambda stubs, metadata: stubs.kv.Compact(request, timeout=self._timeout_s, metadata=metadata)
        )

    # -- leases ----------------------------------------------------------------------------------

    async def grant_lease(self, ttl_s: int) -> int:
        request = rpc.LeaseGrantRequest(TTL=ttl_s)
        reply = await self._call(
            "a lease grant",
            lambda stubs, metadata: stubs.lease.LeaseGrant(request, timeout=self._timeout_s, metadata=metadata),
        )
        return reply.ID

    async def keep_alive(self, lease_id: int) -> int:
        """Refresh a lease once; returns its TTL in seconds (0: it has expired)."""

        async def refresh(stubs: _Stubs, metadata: Metadata) -> int:
            replies = stubs.lease.LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease_id)]), timeout=self._timeout_s, metadata=metadata
            )
            async for reply in replies:
                return reply.TTL
            return 0

        return await self._call("a lease keep-alive", refresh, changes_nothing=True)

    async def revoke_lease(self, lease_id: int) -> None:
        request = rpc.LeaseRevokeRequest(ID=lease_id)
        await self._call(
            "a lease revoke",
            lambda stubs, metadata: stubs.lease.LeaseRevoke(request, timeout=self._timeout_s, metadata=metadata),
        )

    # -- watches ---------------------------------------------------------------------------------

    async def watch(self, name: str, start_revision: int, *, prefix: bool = True) -> AsyncIterator[WatchBatch]:
        """Changes to `name` (and, with `prefix`, every key under it) from `start_revision` on.

        Raises `Compacted` when that revision is no longer in etcd's history and
        `EtcdUnavailable` when the stream breaks; both end the iteration.
        """
        key = self.key(name)
        create = rpc.WatchCreateRequest(
            key=key,
            range_end=prefix_range_end(key) if prefix else b"",
            start_revision=start_revision,
            progress_notify=True,
        )
        for renewed in (False, True):
            token = self._token
            stop = asyncio.Event()

            async def requests(stop: asyncio.Event = stop) -> AsyncIterator[rpc.WatchRequest]:
                yield rpc.WatchRequest(create_request=create)
                while not stop.is_set():  # (half-closing would end the watch)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(WATCH_PROBE_S):
                            await stop.wait()
                    if not stop.is_set():
                        yield rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())

            stubs = await self._live()
            stream = stubs.watch.Watch(requests(), metadata=self._metadata() + _REQUIRE_LEADER)
            replies = aiter(stream)
            try:
                while True:
                    # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the answer when it comes in the
                    # same turn of the loop as a cancellation, and the cancellation is lost (a mirror's stop then
                    # waited for ever: tests/test_etcd_mirror_stop.py).
                    try:
                        async with asyncio.timeout(WATCH_PROBE_S + self._timeout_s):
                            reply = await anext(replies)
                    except StopAsyncIteration:
                        return  # etcd ended the stream
                    except TimeoutError:
                        self._drop(stubs, f"a watch got no answer to a progress request in {self._timeout_s:.0f} s")
                        raise EtcdUnavailable("etcd stopped answering a watch") from None
                    if reply.compact_revision:
                        raise Compacted(reply.compact_revision)
                    if reply.canceled and _WATCH_REFUSED in reply.cancel_reason:
                        if self.credentials is None or renewed:
                            raise EtcdAccessDenied(
                                f"etcd refused a watch of {key.decode()!r}: {reply.cancel_reason} "
                                "(docs/control-plane.md lists what each service's role may read)"
                            )
                        break  # the token went stale: authenticate again, then open the watch again
                    if reply.canceled:
                        raise EtcdUnavailable(f"etcd canceled the watch: {reply.cancel_reason}")
                    if reply.created and not reply.events:
                        continue
                    yield self._batch(reply)
            except grpc.aio.AioRpcError as error:
                self._member_lost(stubs, error)
                raise EtcdUnavailable(f"etcd watch stream broke: {error.code().name} {error.details()}") from error
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise
                # Not this task's cancellation: grpc cancels the calls on a channel being closed (a connection
                # dropped after another call found its member lost), which the caller resumes elsewhere.
                raise EtcdUnavailable("etcd watch stream ended: its connection was dropped") from None
            finally:
                stop.set()
                stream.cancel()
            await self._renew_token(token)

    def _batch(self, reply: rpc.WatchResponse) -> WatchBatch:
        changes = tuple(
            Change(
                self._name(event.kv.key),
                None if event.type == rpc.Event.DELETE else event.kv.value,
                event.kv.mod_revision,
            )
            for event in reply.events
        )
        # A progress notification's header says every change up to it was sent;
        # an event batch vouches only for its own events' revisions.
        revision = max(change.revision for change in changes) if changes else reply.header.revision
        return WatchBatch(revision, changes)

    # -- users and roles (etcd_access sets them up with the root user) ----------------------------

    async def enable_auth(self) -> None:
        await self._call(
            "enabling authentication",
            lambda stubs, metadata: stubs.auth.AuthEnable(
                rpc.AuthEnableRequest(), timeout=self._timeout_s, metadata=metadata
            ),
        )

    async def set_user(self, username: str, password: str, roles: Sequence[str]) -> None:
        """Create the user, or set its password; afterwards it has exactly `roles`."""
        have = await self._user_roles(username)
        if have is None:
            await self._auth_call(
                f"adding user {username!r}",
                "UserAdd",
                rpc.AuthUserAddRequest(name=username, password=password),
            )
            have = []
        elif not await self._password_is(username, password):  # setting it again would end its live tokens
            await self._auth_call(
                f"setting the password of {username!r}",
                "UserChangePassword",
                rpc.AuthUserChangePasswordRequest(name=username, password=password),
            )
        for role in set(roles) - set(have):
            await self._auth_call(
                f"granting role {role!r}", "UserGrantRole", rpc.AuthUserGrantRoleRequest(user=username, role=role)
            )
        for role in set(have) - set(roles):
            await self._auth_call(
                f"revoking role {role!r}", "UserRevokeRole", rpc.AuthUserRevokeRoleRequest(name=username, role=role)
            )

    async def set_role(self, role: str, permissions: Sequence[Permission]) -> None:
        """Create the role if it is missing; afterwards it has exactly `permissions` (names under the prefix)."""
        wanted = {self._permission_range(p): p.write for p in permissions}
        try:
            reply = await self._auth_call(f"reading role {role!r}", "RoleGet", rpc.AuthRoleGetRequest(role=role))
            have = {(perm.key, perm.range_end): perm.permType for perm in reply.perm}
        except EtcdUnavailable as error:
            if "role name not found" not in str(error):
                raise
            await self._auth_call(f"adding role {role!r}", "RoleAdd", rpc.AuthRoleAddRequest(name=role))
            have = {}
        for key, range_end in have.keys() - wanted.keys():
            await self._auth_call(
                f"revoking {role!r}'s permission on {key.decode()!r}",
                "RoleRevokePermission",
                rpc.AuthRoleRevokePermissionRequest(role=role, key=key, range_end=range_end),
            )
        for (key, range_end), write in wanted.items():
            kind = rpc.Permission.READWRITE if write else rpc.Permission.READ
            if have.get((key, range_end)) != kind:
                await self._auth_call(
                    f"granting {role!r} {'read-write' if write else 'read'} on {key.decode()!r}",
                    "RoleGrantPermission",
                    rpc.AuthRoleGrantPermissionRequest(
                        name=role, perm=rpc.Permission(permType=kind, key=key, range_end=range_end)
                    ),
                )

    async def _password_is(self, username: str, password: str) -> bool:
        """Whether etcd (with authentication on) accepts this password for the user."""
        request = rpc.AuthenticateRequest(name=username, password=password)
        try:
            await (await self._live()).auth.Authenticate(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def _user_roles(self, username: str) -> list[str] | None:
        """A user's roles; None when there is no such user."""
        try:
            reply = await self._auth_call(
                f"reading user {username!r}", "UserGet", rpc.AuthUserGetRequest(name=username)
            )
        except EtcdUnavailable as error:
            if "user name not found" in str(error):
                return None
            raise
        return list(reply.roles)

    def _permission_range(self, permission: Permission) -> tuple[bytes, bytes]:
        key = self.key(permission.name)
        return key, prefix_range_end(key) if permission.name.endswith("/") else b""

    async def _auth_call(self, what: str, method: str, request: object) -> Any:
        return await self._call(
            what,
            lambda stubs, metadata: getattr(stubs.auth, method)(request, timeout=self._timeout_s, metadata=metadata),
        )


def _request_op(op: object) -> rpc.RequestOp:
    """A transaction operation built with `Etcd.ops` (put or delete) as etcd's message."""
    if isinstance(op, aetcd.transactions.Put):
        put = rpc.PutRequest(key=op.key, value=op.value, lease=lease_to_id(op.lease), prev_kv=op.prev_kv)
        return rpc.RequestOp(request_put=put)
    if isinstance(op, aetcd.transactions.Delete):
        delete = rpc.DeleteRangeRequest(key=op.key, range_end=op.range_end or b"", prev_kv=op.prev_kv)
        return rpc.RequestOp(request_delete_range=delete)
    raise TypeError(f"not a put or delete: {op!r}")
