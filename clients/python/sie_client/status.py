"""Read the rich status (ErrorInfo, RetryInfo) a server attached to a failed call, and say what grpc's own statuses
mean for the call that got them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from sie.v1 import inference_pb2
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
