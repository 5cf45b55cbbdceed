"""What went wrong with a request the adapter serves, independent of the wire it came on: an HTTP status, a reason
(the contract's ErrorInfo reason, or the adapter's own), a message, the field at fault and a retry delay. Each wire
writes it in its own error shape (reference_wire.py, rerank.py, tei.py, openai_models.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2, status_pb2

from sie_common.edge.errors import MAX_MESSAGE_CHARS, SieError, bounded

# How a gRPC status becomes an HTTP status: the table of Envoy's transcoder (docs/http.md, "Errors").
HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.CANCELLED: 499,
}


@dataclass
class AdapterError(Exception):
    """A refusal or a failure, as HTTP sees it."""

    status: int
    reason: str
    message: str
    field: str | None = None
    retry_after_s: float | None = None
    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.message = bounded(self.message, MAX_MESSAGE_CHARS)
        super().__init__(self.message)

    @property
    def retry_after_header(self) -> dict[str, str]:
        """{"Retry-After": whole seconds, at least 1} when the error says when to retry, else {}."""
        if self.retry_after_s is None:
            return {}
        return {"Retry-After": str(max(1, round(self.retry_after_s)))}


def invalid(message: str, *, reason: str = "INVALID_REQUEST", field: str | None = None) -> AdapterError:
    """400: the body does not say what the protocol asks (a wrong type, an unknown or missing field, ...)."""
    return AdapterError(400, reason, message, field=field)


def from_sie_error(error: SieError) -> AdapterError:
    """An error the adapter's own checks raise as the gateway's would (the token check)."""
    return AdapterError(
        HTTP_STATUS.get(error.code, 500),
        error.reason,
        error.message,
        retry_after_s=error.retry_after_s,
        code=error.code,
        metadata=dict(error.metadata),
    )


def from_rpc_error(error: grpc.aio.AioRpcError) -> AdapterError:
    """The gateway's gRPC error: its code, message, ErrorInfo reason and field, RetryInfo delay."""
    code = error.code()
    reason, metadata, retry = _details(error.trailing_metadata() or ())
    if not reason:
        reason = "UPSTREAM_UNAVAILABLE" if code == grpc.StatusCode.UNAVAILABLE else code.name
        if code == grpc.StatusCode.UNAVAILABLE and retry is None:
            retry = 1.0
    return AdapterError(
        HTTP_STATUS.get(code, 500),
        reason,
        error.details() or code.name,
        field=metadata.get("field") or None,
        retry_after_s=retry,
        code=code,
        metadata=metadata,
    )


def _details(trailers: Iterable[tuple[str, str | bytes]]) -> tuple[str, dict[str, str], float | None]:
    """(reason, ErrorInfo metadata, retry delay in seconds) from a rich status trailer; ("", {}, None) without one."""
    raw = next((value for key, value in trailers if key == "grpc-status-details-bin"), None)
    if not isinstance(raw, bytes):
        return "", {}, None
    status = status_pb2.Status.FromString(raw)
    reason, metadata, retry = "", {}, None
    for detail in status.details:
        info, delay = error_details_pb2.ErrorInfo(), error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            reason, metadata = info.reason, dict(info.metadata)
        elif detail.Unpack(delay):
            retry = delay.retry_delay.ToTimedelta().total_seconds()
    return reason, metadata, retry
