"""Read the rich status (ErrorInfo, RetryInfo) a server attached to a failed call."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2, status_pb2

from sie_client.errors import SIEError, error_class


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


def call_status(error: grpc.RpcError) -> CallStatus:
    """The status of a failed call (sync or asyncio), with its details unpacked."""
    code = error.code()
    message = error.details() or code.name
    # types-grpcio types the trailers as objects with .key/.value; at run time they are (key, value) pairs (a
    # namedtuple in grpc, a Metadata of tuples in grpc.aio), which is what status_from_trailers reads.
    trailers = error.trailing_metadata() or ()
    return status_from_trailers(code, message, trailers)  # type: ignore[arg-type]


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
