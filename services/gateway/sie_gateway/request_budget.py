"""The request bytes the gateway holds for its gRPC calls in flight, leased from the budget its HTTP adapter's bodies
take from (BodyBudget, SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES and its per-caller share), before a message is read.

A message held costs the gateway several times its bytes (the bytes, the parsed message, its merged copy, the
worker's request); and grpc receives a whole message (up to SIE_MAX_RECEIVE_MESSAGE_BYTES) as soon as a handler asks
for it: with unary handlers that is before any interceptor runs, so messages refused for the budget had already cost
their memory (64 refused 16 MB Encodes took a gateway to 1.6 GB, issue 32). So the gateway's handlers ask for each
sie.v1.Inference message themselves, and only once its caller's share and the budget have room for the largest
message (the receive limit): until then HTTP/2 flow control holds the sender back (a call waiting to be read costs
the gateway about 10 KB). While it arrives the message holds that much of the budget, then its own bytes until the
call ends, however it ends (answered, failed, cancelled).

Each message is charged to its caller: the bearer token when the gateway checks tokens, else its client's address
(the x-sie-client-address Envoy writes, from a trusted proxy's connection only; SIE_GATEWAY_TRUSTED_PROXIES), else
the connection's peer address; an IPv6 address's /64 is one caller (ClientAddresses). A unary call whose caller's
share is full of messages already read is refused with RESOURCE_EXHAUSTED/OVERLOADED and a retry delay, unread; one
that only waits for other messages to arrive waits (at most MAX_WAITING_READS_PER_CALLER of a caller's calls,
MAX_WAITING_READS in all, then OVERLOADED); room freed goes to each waiting caller's oldest read in turn. The budget
keeps room to read one more message: a unary message that would leave less is read but not kept (OVERLOADED), so that
small calls are still read while large ones fill it. An EncodeStream reads its next message once there is room: it waits
for its own answers rather than being refused. A unary message that has not all arrived SIE_GATEWAY_HTTP_BODY_TIMEOUT_S
after its read began ends its call DEADLINE_EXCEEDED/REQUEST_TIMEOUT; one still awaited
SIE_GATEWAY_GRPC_READ_EVICT_AFTER_S (1 s) after its read began when another message needs the room ends its call
UNAVAILABLE/OVERLOADED with a retry delay: the gateway cannot tell a message that has not begun from one arriving (grpc
tells it only of whole messages), so callers that open calls and send nothing hold others' room about that long at most
(20 callers' 40 such calls kept 19 of 20 small calls of another past their 20 s deadline, issue 32). Only a read that
has waited EVICT_AFTER_WAITING_S drops another: reads of messages sent at once give their room back sooner. An idle
EncodeStream's read, which waits for its caller's next message, is dropped so after SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S;
it never takes the budget's last room for one more read. Calls on the adapter's own Unix socket are not charged
again: the adapter leased their bodies."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import grpc

from sie_common.edge.auth import (
    CLIENT_ADDRESS_HEADER,
    INFERENCE_CALLS,
    Authorize,
    Metadata,
    bearer_token,
    inference_checks,
)
from sie_common.edge.ended_calls import EndWithoutFrames, close_requests, only_message
from sie_common.edge.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable, abort
from sie_common.edge.malformed_requests import (
    Continuation,
    RejectMalformedRequests,
    StreamBehaviour,
    UnaryBehaviour,
)
from sie_common.runtime.transport import ServerTransport
from sie_gateway.client_address import ClientAddresses
from sie_gateway.http_adapter.bodies import EVICT_AFTER_WAITING_S, BodyBudget, BodyLease
from sie_gateway.http_adapter.errors import AdapterError
from sie_gateway.settings import GatewaySettings

RETRY_AFTER_S = 1.0
# Calls whose message waits for room to be read (each costs the gateway about 10 KB while it waits): of one caller,
# and of all callers. Past either, a call is refused RESOURCE_EXHAUSTED/OVERLOADED at once.
MAX_WAITING_READS_PER_CALLER = 512
MAX_WAITING_READS = 4096
# How often the oldest waiting read looks again for room freed where it is not told (an HTTP body
# answered, a stalled read old enough to drop).
RECHECK_S = 0.05
NO_MESSAGE = InvalidArgument("the call ended without its request message; send one", reason="MALFORMED_REQUEST")


def gateway_transport(settings: GatewaySettings) -> ServerTransport:
    """How the gateway listens: grpc receives messages up to SIE_MAX_RECEIVE_MESSAGE_BYTES, or one caller's share of
    the request budget where that is smaller (a larger message could never be read)."""
    transport = ServerTransport.of(settings)
    largest = min(transport.max_receive_message_bytes, settings.http_max_body_budget_per_caller_bytes)
    return dataclasses.replace(transport, max_receive_message_bytes=largest)


def intake_interceptors(settings: GatewaySettings, budget: BodyBudget) -> list[grpc.aio.ServerInterceptor]:
    """The gateway's gRPC interceptors, in order: the token check, then reading each message within `budget`, then
    parsing (INVALID_ARGUMENT for a malformed message)."""
    checks = inference_checks(settings.auth_mode, settings.auth_tokens)
    largest = gateway_transport(settings).max_receive_message_bytes
    reads = MessageReads(budget, largest, settings.http_body_timeout_s, settings.grpc_read_evict_after_s)
    addresses = ClientAddresses(settings.trusted_proxies)
    return [Authorize(checks), LeaseRequestBytes(reads, bool(checks), addresses), RejectMalformedRequests()]


@dataclasses.dataclass(eq=False)
class _Turn:
    """A read waiting for room; `granted` once _wake has held the room for it."""

    lease: BodyLease
    stream: bool
    since: float  # when it began to wait (the loop's time)
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    granted: bool = False


class MessageReads:
    """Reads of gRPC messages within `budget`: each holds `largest` bytes (the receive limit) of its caller's share
    and of the budget while its message arrives, then the message's own bytes; `timeout_s` bounds a unary call's,
    which may be dropped for another message once it has held its room for `evict_after_s`."""

    def __init__(self, budget: BodyBudget, largest: int, timeout_s: float, evict_after_s: float) -> None:
        self.budget = budget
        self.largest = largest
        self.timeout_s = timeout_s
        self.evict_after_s = evict_after_s
        self._reading: collections.Counter[str] = collections.Counter()  # bytes of reads in progress, per caller
        self._reading_total = 0
        # Per caller, oldest first; callers in the order they are next given room.
        self._waiting: dict[str, collections.deque[_Turn]] = {}
        self.waiting = 0

    @contextlib.contextmanager
    def lease(self, caller: str) -> Iterator[BodyLease]:
        """A lease for one message of `caller`; its bytes return (and waiting reads look for room) when it closes."""
        try:
            with self.budget.lease(caller) as lease:
                yield lease
        finally:
            self._wake()

    async def read(
        self, lease: BodyLease, messages: AsyncIterator[bytes], context: grpc.aio.ServicerContext, *, stream: bool
    ) -> bytes | None:
        """The next message of `messages` (None at its end) once there is room for it, its bytes held by `lease`. A
        unary call (`stream` False) is refused while its caller's share or the budget is full of messages already
        read; an EncodeStream waits for its own answers instead."""
        await self._room(lease, context, stream)
        raw: bytes | None = None
        timed_out = False
        try:
            async with asyncio.timeout(None if stream else self.timeout_s) as deadline:
                with lease.reading(deadline, None if stream else self.evict_after_s):
                    raw = await (anext(aiter(messages), None) if stream else only_message(messages))
        except TimeoutError:
            timed_out = True
        finally:
            self._unhold(lease.caller)
            if not lease.evicted:
                self.budget.shrink(lease, len(raw) if raw is not None else 0)
            self._wake()
        if lease.evicted:
            await abort(context, self._dropped(stream))
        if timed_out:
            await abort(context, self._late())
        if raw is None and not stream:
            await abort(context, NO_MESSAGE)
        if not stream and self.budget.held - self._reading_total + self.largest > self.budget.limit:
            await abort(context, self._not_kept(len(raw or b"")))
        return raw

    async def _room(self, lease: BodyLease, context: grpc.aio.ServicerContext, stream: bool) -> None:
        """Hold `largest` bytes on `lease` once its caller's share and the budget have room, its caller's reads
        waiting in turn (oldest first; _wake gives them the room)."""
        caller = lease.caller
        if caller not in self._waiting and self._hold(lease, stream, evict=False):
            return
        if not stream and self._full(caller):
            await abort(context, self._refusal(caller))
        queue = self._waiting.get(caller, collections.deque())
        if len(queue) >= MAX_WAITING_READS_PER_CALLER or self.waiting >= MAX_WAITING_READS:
            await abort(context, self._crowded(len(queue) >= MAX_WAITING_READS_PER_CALLER))
        self._waiting[caller] = queue
        turn = _Turn(lease, stream, asyncio.get_running_loop().time())
        queue.append(turn)
        self.waiting += 1
        try:
            while not turn.granted:
                # Only the oldest waiting read looks again on a timer (for stalled reads old enough to drop): one
                # timer however many callers wait, not one each (3,000 callers' timers took the gateway's loop).
                oldest = next(iter(self._waiting.values()))[0] is turn
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RECHECK_S if oldest else None):
                        await turn.ready.wait()
                if oldest and not turn.granted:
                    self._wake()
                if turn.granted:
                    return
                turn.ready.clear()
                if not stream and self._full(caller):
                    await abort(context, self._refusal(caller))
        except BaseException:
            if turn.granted:  # given room, gone before reading: the lease's bytes return when it closes
                self._unhold(caller)
            raise
        finally:
            self._dequeue(turn)

    def _dequeue(self, turn: _Turn) -> None:
        queue = self._waiting.get(turn.lease.caller)
        if queue is None or turn not in queue:
            return
        queue.remove(turn)
        self.waiting -= 1
        if not queue:
            del self._waiting[turn.lease.caller]

    def _hold(self, lease: BodyLease, stream: bool, evict: bool) -> bool:
        """Grow `lease` by `largest` bytes if the caller's share and the budget have room (with `evict`, dropping
        reads that have stalled long enough to make it, BodyBudget.take); whether it did. An EncodeStream's message,
        which is kept once read, also needs the budget to keep room for one more read after it."""
        if stream and self.budget.held + 2 * self.largest > self.budget.limit:
            return False
        try:
            lease.grow(self.largest, evict)
        except AdapterError:
            return False
        self._reading[lease.caller] += self.largest
        self._reading_total += self.largest
        return True

    def _full(self, caller: str) -> bool:
        """Whether messages already read (not reads in progress, which end soon) leave no room for one more."""
        budget = self.budget
        return (
            budget.held_by(caller) - self._reading[caller] + self.largest > budget.caller_limit
            or budget.held - self._reading_total + self.largest > budget.limit
        )

    def _wake(self) -> None:
        """Give the room there is to waiting reads: each caller's oldest in turn (a caller given room goes to the
        back, so many callers share the room in rounds and none is passed over), until the budget has no room for
        another; wake the unary reads to refuse (their caller's share, or the budget, full of messages already read),
        and the oldest read still waiting (it looks again on a timer). Only reads that have waited
        EVICT_AFTER_WAITING_S drop stalled reads for their room."""
        now = asyncio.get_running_loop().time()
        for caller in list(self._waiting):
            turn = self._waiting[caller][0]
            if self._hold(turn.lease, turn.stream, evict=now - turn.since >= EVICT_AFTER_WAITING_S):
                turn.granted = True
                self._dequeue(turn)
                if caller in self._waiting:
                    self._waiting[caller] = self._waiting.pop(caller)
                turn.ready.set()
            elif not turn.stream and self._full(caller):
                turn.ready.set()
            elif not turn.stream and self._no_room_left(caller):
                break
        if self._waiting:
            next(iter(self._waiting.values()))[0].ready.set()

    def _no_room_left(self, caller: str) -> bool:
        """After a unary read of `caller` found no room: whether no other read could find any (the budget is full,
        not only its caller's share, and had no stalled read to drop)."""
        budget = self.budget
        full = budget.held + self.largest > budget.limit
        return full and budget.held_by(caller) + self.largest <= budget.caller_limit

    def _unhold(self, caller: str) -> None:
        """Undo _hold's count of a read in progress (its lease's bytes are the lease's to return)."""
        self._reading[caller] -= self.largest
        self._reading_total -= self.largest
        if not self._reading[caller]:
            del self._reading[caller]

    def _refusal(self, caller: str) -> ResourceExhausted:
        budget = self.budget
        if budget.held_by(caller) - self._reading[caller] + self.largest > budget.caller_limit:
            held = (
                f"as many bytes of this caller's requests as one caller may ({budget.caller_limit} bytes, "
                "SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_PER_CALLER_BYTES) less room for one more message of up to "
                f"{self.largest} bytes (SIE_MAX_RECEIVE_MESSAGE_BYTES): wait for answers before sending more"
            )
        else:
            held = (
                f"as many request bytes as it may ({budget.limit} bytes, SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES) "
                f"less room for one more message of up to {self.largest} bytes"
            )
        return ResourceExhausted(
            f"this message was not read: the gateway holds {held}; retry",
            reason="OVERLOADED",
            retry_after_s=RETRY_AFTER_S,
        )

    def _not_kept(self, size: int) -> ResourceExhausted:
        return ResourceExhausted(
            f"this message of {size} bytes was read but not kept: the gateway's request budget "
            f"({self.budget.limit} bytes, SIE_GATEWAY_HTTP_MAX_BODY_BUDGET_BYTES) keeps room to read one more message "
            f"of up to {self.largest} bytes (SIE_MAX_RECEIVE_MESSAGE_BYTES), so that small calls are still read "
            "while large ones fill it; retry, or send smaller requests",
            reason="OVERLOADED",
            retry_after_s=RETRY_AFTER_S,
        )

    def _crowded(self, own: bool) -> ResourceExhausted:
        whose, limit = (
            ("of this caller's", MAX_WAITING_READS_PER_CALLER) if own else ("of all callers'", MAX_WAITING_READS)
        )
        return ResourceExhausted(
            f"this message was not read: {limit} calls {whose} already wait for room in the gateway's request "
            "budget; wait for answers before sending more, and retry",
            reason="OVERLOADED",
            retry_after_s=RETRY_AFTER_S,
        )

    def _dropped(self, stream: bool) -> Unavailable:
        after, setting = (
            (self.budget.evict_after_s, "SIE_GATEWAY_HTTP_BODY_EVICT_AFTER_S")
            if stream
            else (self.evict_after_s, "SIE_GATEWAY_GRPC_READ_EVICT_AFTER_S")
        )
        return Unavailable(
            f"this call's message was still awaited {after:g} s after the gateway asked for it ({setting}) when its "
            "request budget needed the room it held: send each message at once (on an EncodeStream, close it when "
            "idle), and retry",
            reason="OVERLOADED",
            retry_after_s=RETRY_AFTER_S,
        )

    def _late(self) -> DeadlineExceeded:
        return DeadlineExceeded(
            f"the request message did not arrive within {self.timeout_s:g} s of the gateway asking for it "
            "(SIE_GATEWAY_HTTP_BODY_TIMEOUT_S): send it at once, or send less",
            reason="REQUEST_TIMEOUT",
        )


class LeaseRequestBytes(grpc.aio.ServerInterceptor):
    """Read each sie.v1.Inference message within the request budget (MessageReads) before it is parsed. List it
    before RejectMalformedRequests (whose handlers take the raw bytes), after Authorize (a caller refused for its
    token holds nothing); `checks_tokens`: whether Authorize checks tokens, so the token names the caller."""

    def __init__(self, reads: MessageReads, checks_tokens: bool, addresses: ClientAddresses) -> None:
        self._reads = reads
        self._checks_tokens = checks_tokens
        self._addresses = addresses

    async def intercept_service(
        self, continuation: Continuation, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        inference = handler_call_details.method.startswith(INFERENCE_CALLS)
        # RejectMalformedRequests's handlers take the raw bytes (intake_interceptors lists it after this one).
        if not inference or handler is None or handler.request_deserializer is not None:
            return handler
        metadata = handler_call_details.invocation_metadata
        serialize = handler.response_serializer
        reads = self._reads
        if handler.unary_unary is not None:
            behaviour = cast(UnaryBehaviour, handler.unary_unary)

            # Served as a stream of requests, so that grpc reads the one message only when this asks for it.
            async def unary_unary(raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> Any:
                with EndWithoutFrames():
                    caller = self._caller(metadata, context.peer())
                    if caller is None:
                        raw = await only_message(raw_requests)
                        if raw is None:
                            await abort(context, NO_MESSAGE)
                        return await behaviour(raw, context)
                    with reads.lease(caller) as lease:
                        raw = await reads.read(lease, raw_requests, context, stream=False)
                        return await behaviour(raw, context)
                return None

            return grpc.stream_unary_rpc_method_handler(unary_unary, response_serializer=serialize)
        if handler.stream_stream is not None:
            streaming = cast(StreamBehaviour, handler.stream_stream)

            async def stream_stream(
                raw_requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
            ) -> AsyncIterator[Any]:
                caller = self._caller(metadata, context.peer())
                if caller is None:  # RejectMalformedRequests closes the requests
                    with EndWithoutFrames():
                        async for response in streaming(raw_requests, context):
                            yield response
                    return
                # One lease per message not yet answered, oldest first: each answer returns the oldest.
                held: collections.deque[contextlib.ExitStack] = collections.deque()

                async def leased() -> AsyncIterator[bytes]:
                    while True:
                        with contextlib.ExitStack() as message:
                            lease = message.enter_context(reads.lease(caller))
                            raw = await reads.read(lease, raw_requests, context, stream=True)
                            if raw is None:
                                return
                            held.append(message.pop_all())
                        yield raw

                try:
                    with EndWithoutFrames():
                        async for response in streaming(leased(), context):
                            if held:
                                held.popleft().close()
                            yield response
                finally:
                    while held:
                        held.popleft().close()
                    await close_requests(raw_requests)

            return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=serialize)
        return handler

    def _caller(self, metadata: Metadata, peer: str) -> str | None:
        """Who sends the call, for its share (None on the adapter's Unix socket): its bearer token when the gateway
        checks tokens (the adapter's key: one token's HTTP bodies and gRPC messages share one share); else its
        client's address (ClientAddresses: named by a trusted proxy, or the connection's peer), the adapter's key
        too."""
        if peer.startswith("unix:"):
            return None
        if self._checks_tokens:
            return f"token {bearer_token(metadata)}"
        named = next((value for key, value in metadata or () if key == CLIENT_ADDRESS_HEADER), None)
        return f"address {self._addresses.client(peer_host(peer), named)}"


def peer_host(peer: str) -> str:
    """The address of a gRPC peer without its port: 'ipv4:10.0.0.5:41234' and 'ipv6:[::1]:41234', which grpc writes
    as a URI ('ipv6:%5B::1%5D:41234', a zone's '%' as '%25'): undecoded, no IPv6 peer was ever a trusted proxy."""
    address = urllib.parse.unquote(peer.partition(":")[2])
    host = address.rpartition(":")[0] or address
    return host.removeprefix("[").removesuffix("]")
