"""What the client raises: one class per thing a caller handles differently.

Every error carries the gRPC `code`, the server's machine-readable `reason`
(google.rpc.ErrorInfo) and its `message`. The reference SDK's class names
(ModelLoadingError, LoraLoadingError, ModelLoadFailedError, PoolError,
SIEConnectionError, RequestError, ServerError) are classes here too, chosen by
the same code and reason (docs/migration.md).
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc


class SIEError(Exception):
    def __init__(
        self, message: str, *, code: grpc.StatusCode, reason: str = "", metadata: Mapping[str, str] | None = None
    ) -> None:
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
    """The model's weights or adapter could not be loaded (reason MODEL_LOAD_FAILED or LORA_LOAD_FAILED)."""


ModelLoadFailedError = ModelLoadError


class ResourceExhaustedError(SIEError):
    """The server is at capacity (RESOURCE_EXHAUSTED) and stayed so through the client's retries."""


class UnavailableError(SIEError):
    """The server cannot serve now (UNAVAILABLE), e.g. a model still loading when waits are off."""


class SIEConnectionError(UnavailableError):
    """The server could not be reached (UNAVAILABLE without a server reason: refused, reset, no route)."""


class ModelLoadingError(UnavailableError):
    """The model is still loading (reason MODEL_LOADING) and the client did not wait for it."""


class LoraLoadingError(UnavailableError):
    """The LoRA adapter was still loading (reason LORA_LOADING) after the client's tries."""


class ProvisioningError(UnavailableError):
    """No capacity for the request's machine profile yet (reason PROVISIONING)."""


class ProvisioningTimeoutError(ProvisioningError):
    """Capacity did not arrive within `provision_timeout_s`."""


class ItemError(RequestError, ValueError):
    """An item the client cannot send (an unknown or unsupported field, or one of the wrong type); raised before any
    call."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(
            message, code=grpc.StatusCode.INVALID_ARGUMENT, reason="INVALID_ITEM_FIELD", metadata={"field": field}
        )


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
    "LORA_LOAD_FAILED": ModelLoadError,
    "MODEL_LOADING": ModelLoadingError,
    "LORA_LOADING": LoraLoadingError,
    "PROVISIONING": ProvisioningError,
}


class PoolError(SIEError):
    """A pool call was refused (a reason naming pools: POOL_NOT_FOUND, POOLS_DISABLED, POOL_TOO_LARGE, ...).

    Each is also the class of its code: a missing pool is a PoolError and a NotFoundError."""


# PoolError combined with each code's class, e.g. PoolNotFoundError(PoolError, NotFoundError).
_POOL_SUMMARY = (PoolError.__doc__ or "").splitlines()[0]
_POOL_BY_CLASS: dict[type[SIEError], type[PoolError]] = {
    cls: type(f"Pool{cls.__name__}", (PoolError, cls), {"__doc__": f"{_POOL_SUMMARY} ({cls.__name__})"})
    for cls in {*_BY_CODE.values(), ServerError}
}


def error_class(code: grpc.StatusCode, reason: str) -> type[SIEError]:
    if code == grpc.StatusCode.UNAVAILABLE and not reason:
        return SIEConnectionError
    by_code = _BY_CODE.get(code, ServerError)
    if "POOL" in reason:
        return _POOL_BY_CLASS[by_code]
    return _BY_REASON.get(reason) or by_code
