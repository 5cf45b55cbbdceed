"""Read the rich status (ErrorInfo, RetryInfo) a server attached to a failed call, and say what grpc's own statuses
mean for the call that got them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from sie.v1 import inference_pb2
from sie_client.errors import SIEError, error_class

T = TypeVar("T")


@dataclass(frozen=True)
class CallStatus:
    code: grpc.StatusCode
    message: str
    reason: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    retry_after_s: float | None = None

    def error(self) -> SIEError:
        return error_class(self.code, self.reason).from_status(
            self.message,
            grpc_code=self.code,
            reason=self.reason,
            metadata=self.metadata,
            retry_after=self.retry_after_s,
        )


@dataclass(frozen=True)
class CallSite:
    """Where a call went and how long the client waits for its answer: what an error names when the status alone
    would leave the caller guessing."""

    # The RPC's full name, "sie.v1.Inference/Encode".
    rpc: str
    target: str
    # The client's read_timeout_s: each call's deadline.
    timeout_s: float

    def timed_out(self, detail: str) -> CallStatus:
        """DEADLINE_EXCEEDED naming the setting that ran out and its value."""
        return CallStatus(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"{self.rpc} on {self.target}: no answer {detail}. read_timeout_s={self.timeout_s:g} is the client's "
            "deadline for each answer: raise read_timeout_s (or timeout_s) of the client for slower calls",
        )


def explained(status: CallStatus, site: CallSite) -> CallStatus:
    """grpc's own statuses (no ErrorInfo: every SIE server gives its errors a reason) as what they mean here: a
    deadline is the client's read_timeout_s running out; UNIMPLEMENTED is a server that does not serve the RPC, i.e.
    not an SIE server (or one too old for this client). Any other status as it is."""
    if status.reason:
        return status
    if status.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return site.timed_out(f"within {site.timeout_s:g} s (grpc: {status.message})")
    if status.code == grpc.StatusCode.UNIMPLEMENTED:
        return CallStatus(
            status.code,
            f"{site.target} does not serve {site.rpc} (it answered UNIMPLEMENTED: {status.message!r}): this does not "
            "look like an SIE server, or it is one older than this client. Point the client's base_url at a worker, "
            "a gateway or the HTTP port of `sie up` (Envoy), which serve sie.v1.Inference",
        )
    return status


def rpc_name(request: Message) -> str:
    """The full name of the Inference RPC that takes `request` ("sie.v1.Inference/Encode")."""
    service = inference_pb2.DESCRIPTOR.services_by_name["Inference"]
    method = next(method for method in service.methods if method.input_type is request.DESCRIPTOR)
    return f"{service.full_name}/{method.name}"


def call_status(error: grpc.RpcError) -> CallStatus:
    """The status of a failed call (sync or asyncio), with its details unpacked."""
    code = error.code()
    message = error.details() or code.name
    # types-grpcio types the trailers as objects with .key/.value; at run time they are (key, value) pairs (a
    # namedtuple in grpc, a Metadata of tuples in grpc.aio), which is what status_from_trailers reads.
    trailers = error.trailing_metadata() or ()
    return status_from_trailers(code, message, trailers)  # type: ignore[arg-type]


# The status grpc.aio gives a call of its own when a write fails as the call ends (grpc/grpc#36066): INTERNAL, these
# details, and a debug string naming the failed batch (a server's own status names the peer instead).
WRITE_FAILED_DETAILS = "Internal error from Core"
WRITE_FAILED_DEBUG = 'Failed "execute_batch"'
# How long to wait for the status grpc replaced: it has arrived, and grpc sets it within milliseconds.
DELIVERED_STATUS_WAIT_S = 5.0


class DeliveredStatus:
    """The status the server (or the channel) ended a streaming call with, as grpc delivers it. grpc.aio replaces it
    with its own INTERNAL "Internal error from Core" when a write of the client's is in flight as the server ends the
    stream (grpc/grpc#36066), before or after the real one arrives: a server that is not SIE answers EncodeStream
    UNIMPLEMENTED at once, and a gateway refuses a missing token, while the client is still writing its first
    requests; 72 of 200 such streams reported INTERNAL."""

    def __init__(self, call: grpc.aio.Call) -> None:
        self._status: CallStatus | None = None
        self._arrived = asyncio.Event()
        call.add_done_callback(self._record)  # called each time grpc sets the call's status

    def _record(self, call: grpc.aio.Call) -> None:
        if self._status is not None:
            return
        # The call has ended, so its status is set and these return without waiting.
        code = _settled(call.code())
        if code is None:
            return
        details = _settled(call.details()) or code.name
        # grpc.aio's Call has debug_error_string(), though its type stubs leave it out.
        if _replaced(code, details, _settled(call.debug_error_string()) or ""):  # type: ignore[attr-defined]
            return
        trailers = _settled(call.trailing_metadata()) or ()
        self._status = status_from_trailers(code, details, trailers)
        self._arrived.set()

    async def of(self, error: grpc.aio.AioRpcError) -> CallStatus:
        """The status `error` ended the call with, or, where grpc replaced it, the one delivered (waited for up to
        DELIVERED_STATUS_WAIT_S: grpc sets it once it has read it)."""
        status = call_status(error)
        if not _replaced(status.code, status.message, error.debug_error_string() or ""):
            return status
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DELIVERED_STATUS_WAIT_S):
                await self._arrived.wait()
        return self._status or status


def _replaced(code: grpc.StatusCode, details: str, debug: str) -> bool:
    """Whether a status is the one grpc gives a call whose write failed (a server may send the same code and details,
    never that debug string)."""
    return code == grpc.StatusCode.INTERNAL and details == WRITE_FAILED_DETAILS and debug.startswith(WRITE_FAILED_DEBUG)


def _settled(coroutine: Coroutine[Any, Any, T]) -> T | None:
    """The result of a coroutine that finishes without waiting; None (and the coroutine closed) if it would wait."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value
    coroutine.close()
    return None


def status_from_trailers(
    code: grpc.StatusCode, message: str, trailers: Iterable[tuple[str, str | bytes]]
) -> CallStatus:
    details = next((value for key, value in trailers if key == "grpc-status-details-bin"), None)
    if details is None:
        return CallStatus(code, message)
    return status_from_proto(status_pb2.Status.FromString(details), fallback_code=code)


def status_from_proto(status: status_pb2.Status, *, fallback_code: grpc.StatusCode | None = None) -> CallStatus:
    """A google.rpc.Status (as carried in stream answers) as a CallStatus."""
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), fallback_code or grpc.StatusCode.UNKNOWN)
    reason, metadata, retry_after = "", {}, None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Unpack(retry):
            retry_after = retry.retry_delay.ToTimedelta().total_seconds()
    return CallStatus(code, status.message, reason, metadata, retry_after)
