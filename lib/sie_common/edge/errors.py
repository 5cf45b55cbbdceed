"""Errors every service answers with: a gRPC status code, a message a person
can act on, and a machine-readable reason in google.rpc.ErrorInfo."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

ERROR_DOMAIN = "sie"


# The most characters of a message, and of each ErrorInfo metadata value, any error carries: whatever a message
# repeats of a caller's values, its status fits gRPC's metadata limits (8 KiB soft, 16 KiB hard: past them a caller
# gets RESOURCE_EXHAUSTED "metadata size exceeds hard limit", HTTP 429, instead of the error).
MAX_MESSAGE_CHARS = 1024
MAX_METADATA_CHARS = 256


def bounded(text: str, limit: int) -> str:
    """`text` whole when short, else its start and its end around how much was left out (the end of a message says
    what to change)."""
    if len(text) <= limit:
        return text
    head, tail = (limit * 2) // 3, limit // 4
    return f"{text[:head]}... ({len(text) - head - tail} characters left out) ...{text[-tail:]}"


class SieError(Exception):
    """Base class: subclasses fix the status code; `reason` is an UPPER_SNAKE tag. The message and the metadata
    values are bounded here, once for every error (MAX_MESSAGE_CHARS, MAX_METADATA_CHARS)."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        metadata: Mapping[str, str] | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        message = bounded(message, MAX_MESSAGE_CHARS)
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.metadata = {key: bounded(value, MAX_METADATA_CHARS) for key, value in (metadata or {}).items()}
        # When set: google.rpc.RetryInfo and a `retry-after` trailer tell the caller when to try again.
        self.retry_after_s = retry_after_s

    def to_status(self) -> status_pb2.Status:
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=ERROR_DOMAIN, metadata=self.metadata)
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        status.details.add().Pack(info)
        if self.retry_after_s is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_after_s * 1e9))
            status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        return status


class InvalidArgument(SieError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SieError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(SieError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(SieError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unauthenticated(SieError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(SieError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(SieError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Aborted(SieError):
    """A concurrent change won a race (e.g. a guarded etcd write); the caller may retry."""

    code = grpc.StatusCode.ABORTED


class Unavailable(SieError):
    """Retry later: always says after how long."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(
        self, message: str, *, reason: str, retry_after_s: float, metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message, reason=reason, metadata=metadata, retry_after_s=retry_after_s)


class DeadlineExceeded(SieError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(SieError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(SieError):
    code = grpc.StatusCode.INTERNAL


# Names a "not found" message lists at most: the message travels in gRPC metadata, which has a size limit.
LISTED_NAMES = 10


def some_of(names: Iterable[str], limit: int = LISTED_NAMES) -> str:
    """'a, b, c' for a few names, and how many there are in all when there are more ('none' for none)."""
    ordered = sorted(names)
    if not ordered:
        return "none"
    shown = ", ".join(ordered[:limit])
    return shown if len(ordered) <= limit else f"{shown} and {len(ordered) - limit} more ({len(ordered)} in all)"


# Characters of a caller's own string an error message or ErrorInfo value repeats at most (the rest is counted).
SHOWN_CHARS = 64


def clipped(value: str, limit: int = SHOWN_CHARS) -> str:
    """`value` as an error may repeat it: whole when short, else its start and its length.

    Errors travel in gRPC trailers, which a caller refuses past 8-16 KiB (RESOURCE_EXHAUSTED, not the error)."""
    return value if len(value) <= limit else f"{value[:limit]}... ({len(value)} characters)"


def status_reason(status: status_pb2.Status) -> str:
    """The ErrorInfo reason a status carries ("" when it has none)."""
    info = error_details_pb2.ErrorInfo()
    return next((info.reason for detail in status.details if detail.Unpack(info)), "")


# The most bytes of the trailers that carry an error (grpc-message percent-encoded, grpc-status-details-bin in base64):
# a message of MAX_MESSAGE_CHARS characters that are not ASCII would take 3-4 times that, past what callers accept.
MAX_STATUS_TRAILER_BYTES = 4096


def fitted(status: status_pb2.Status) -> status_pb2.Status:
    """`status` with its message shortened until its trailers take at most MAX_STATUS_TRAILER_BYTES; if that is not
    enough, without its ErrorInfo metadata too (its code, reason and retry delay are always kept)."""
    for details in (status.details, _essential(status.details)):
        limit = MAX_MESSAGE_CHARS
        while True:
            fitting = status_pb2.Status(code=status.code, message=bounded(status.message, limit), details=details)
            if status_trailer_bytes(fitting) <= MAX_STATUS_TRAILER_BYTES or limit <= SHOWN_CHARS:
                break
            limit //= 2
        if status_trailer_bytes(fitting) <= MAX_STATUS_TRAILER_BYTES:
            break
    return fitting


def _essential(details: Iterable[any_pb2.Any]) -> list[any_pb2.Any]:
    """ErrorInfo without its metadata, and RetryInfo; nothing else."""
    kept = []
    for detail in details:
        info, retry = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            info = error_details_pb2.ErrorInfo(reason=info.reason[:SHOWN_CHARS], domain=info.domain[:SHOWN_CHARS])
        elif not detail.Unpack(retry):
            continue
        packed = any_pb2.Any()
        packed.Pack(info if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR) else retry)
        kept.append(packed)
    return kept


def status_trailer_bytes(status: status_pb2.Status) -> int:
    """The bytes of the trailers that carry `status` (grpc-message percent-encoded, grpc-status-details-bin)."""
    encoded = sum(1 if 0x20 <= byte <= 0x7E and byte != 0x25 else 3 for byte in status.message.encode())
    return encoded + (len(status.SerializeToString()) + 2) // 3 * 4


def status_trailers(status: status_pb2.Status) -> tuple[tuple[str, str | bytes], ...]:
    """Trailing metadata carrying a rich status (and `retry-after` when it has a RetryInfo)."""
    trailers: list[tuple[str, str | bytes]] = [("grpc-status-details-bin", status.SerializeToString())]
    for detail in status.details:
        retry = error_details_pb2.RetryInfo()
        if detail.Unpack(retry):
            seconds = retry.retry_delay.ToTimedelta().total_seconds()
            trailers.append(("retry-after", str(max(1, round(seconds)))))
    return tuple(trailers)


async def abort(context: grpc.aio.ServicerContext, error: SieError) -> NoReturn:
    """End the call with `error`'s status, message and details."""
    await abort_with_status(context, error.to_status())


async def abort_with_status(context: grpc.aio.ServicerContext, status: status_pb2.Status) -> NoReturn:
    """End the call with a google.rpc.Status as it is (e.g. one a worker answered with), its trailers bounded."""
    code = next((c for c in grpc.StatusCode if c.value[0] == status.code), grpc.StatusCode.UNKNOWN)
    status = fitted(status)
    await context.abort(code, status.message, trailing_metadata=status_trailers(status))
    raise AssertionError("context.abort returned")  # it raises; this tells type checkers so
