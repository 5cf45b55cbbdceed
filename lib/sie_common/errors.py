"""Errors every service answers with: a gRPC status code, a message a person
can act on, and a machine-readable reason in google.rpc.ErrorInfo."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2

ERROR_DOMAIN = "sie"


class SieError(Exception):
    """Base class: subclasses fix the status code; `reason` is an UPPER_SNAKE tag."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, reason: str, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.metadata = dict(metadata or {})

    def to_status(self) -> status_pb2.Status:
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=ERROR_DOMAIN, metadata=self.metadata)
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        status.details.add().Pack(info)
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


class Unavailable(SieError):
    """Retry later: carries the delay in google.rpc.RetryInfo and a `retry-after` trailer."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(self, message: str, *, reason: str, retry_after_s: float, metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message, reason=reason, metadata=metadata)
        self.retry_after_s = retry_after_s

    def to_status(self) -> status_pb2.Status:
        status = super().to_status()
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(self.retry_after_s * 1e9))
        status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        return status


class DeadlineExceeded(SieError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unimplemented(SieError):
    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(SieError):
    code = grpc.StatusCode.INTERNAL


def status_trailers(error: SieError) -> tuple[tuple[str, str | bytes], ...]:
    """Trailing metadata carrying the rich status (and `retry-after` when there is one)."""
    trailers: list[tuple[str, str | bytes]] = [("grpc-status-details-bin", error.to_status().SerializeToString())]
    if isinstance(error, Unavailable):
        trailers.append(("retry-after", str(max(1, round(error.retry_after_s)))))
    return tuple(trailers)


async def abort(context: grpc.aio.ServicerContext, error: SieError) -> NoReturn:
    """End the call with `error`'s status, message and details."""
    await context.abort(error.code, error.message, trailing_metadata=status_trailers(error))
    raise AssertionError("context.abort returned")  # it raises; this tells type checkers so
