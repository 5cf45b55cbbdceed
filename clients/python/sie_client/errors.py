"""What the client raises: one class per thing a caller handles differently.

Every error carries the gRPC `code`, the server's machine-readable `reason`
(google.rpc.ErrorInfo) and its `message`.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc


class SIEError(Exception):
    def __init__(self, message: str, *, code: grpc.StatusCode, reason: str = "", metadata: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata = dict(metadata or {})

    def __str__(self) -> str:
        tag = f"{self.code.name}/{self.reason}" if self.reason else self.code.name
        return f"{self.message} [{tag}]"


class RequestError(SIEError):
    """The request is wrong (INVALID_ARGUMENT): fix it, retrying will not help."""


class NotFoundError(SIEError):
    """The model, profile, bundle or pool does not exist (NOT_FOUND)."""


class PreconditionError(SIEError):
    """The server cannot do this as configured (FAILED_PRECONDITION)."""


class ModelLoadError(PreconditionError):
    """The model's weights or adapter could not be loaded (reason MODEL_LOAD_FAILED)."""


class ResourceExhaustedError(SIEError):
    """The server is at capacity (RESOURCE_EXHAUSTED) and stayed so through the client's retries."""


class UnavailableError(SIEError):
    """The server cannot serve now (UNAVAILABLE), e.g. a model still loading when waits are off."""


class ProvisioningError(UnavailableError):
    """No capacity for the request's machine profile yet (reason PROVISIONING)."""


class ProvisioningTimeoutError(ProvisioningError):
    """Capacity did not arrive within `provision_timeout_s`."""


class AuthError(SIEError):
    """Missing or wrong credentials (UNAUTHENTICATED / PERMISSION_DENIED)."""


class ServerError(SIEError):
    """The server failed (INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, ...)."""


_BY_CODE: dict[grpc.StatusCode, type[SIEError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: RequestError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: PreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: AuthError,
    grpc.StatusCode.PERMISSION_DENIED: AuthError,
}
_BY_REASON: dict[str, type[SIEError]] = {
    "MODEL_LOAD_FAILED": ModelLoadError,
    "PROVISIONING": ProvisioningError,
}


def error_class(code: grpc.StatusCode, reason: str) -> type[SIEError]:
    return _BY_REASON.get(reason) or _BY_CODE.get(code, ServerError)
