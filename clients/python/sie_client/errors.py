"""What the client raises: the reference SDK's error classes (same names, constructors, bases and attributes), and
ours where a caller handles a case differently.

A reference user's `except RequestError` / `except ServerError` catches what the reference's would: each server
answer maps to the reference's class by its status and reason (see `error_class`). Every error the client raises from
a server answer also carries what gRPC said: `grpc_code` (grpc.StatusCode), `reason` (the server's machine-readable
google.rpc.ErrorInfo reason, "" without one) and `metadata` (ErrorInfo's); `code` is the reference's error code (the
reason, None without one) and `status_code` the HTTP status the same answer has over HTTP.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Self

import grpc

# The HTTP status of each gRPC code, as Envoy's transcoder and the gateway's HTTP errors give it.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}


class SIEError(Exception):
    """Base of every error the client raises. Constructed as any exception (`SIEError("message")`), as the
    reference's is; the client fills the attributes below from the server's answer."""

    message: str = ""
    # The reference's: the machine-readable error code (our reason), and the HTTP status.
    code: str | None = None
    status_code: int | None = None
    # Ours: the gRPC status, the ErrorInfo reason and metadata of the answer.
    grpc_code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    reason: str = ""
    metadata: Mapping[str, str] = MappingProxyType({})
    # Set on errors made from a server's answer (and ItemError): str() then tags the message with the status.
    _answered: bool = False

    def __str__(self) -> str:
        text = super().__str__()
        if not self._answered:
            return text
        tag = f"{self.grpc_code.name}/{self.reason}" if self.reason else self.grpc_code.name
        return f"{text} [{tag}]"

    @classmethod
    def from_status(
        cls,
        message: str,
        *,
        grpc_code: grpc.StatusCode,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
    ) -> Self:
        """The error for a server's answer: the class's own constructor with what it takes of the answer (model,
        lora, gpu, pool name, retry delay, ...), then the answer's status on it."""
        metadata = dict(metadata or {})
        offered: dict[str, Any] = {
            "code": reason or None,
            "status_code": HTTP_STATUS.get(grpc_code, 500),
            "retry_after": retry_after,
            "model": metadata.get("model"),
            "lora": metadata.get("lora"),
            "gpu": metadata.get("machine_profile"),
            "pool_name": metadata.get("pool"),
            "field": metadata.get("field", ""),
        }
        try:
            accepted = inspect.signature(cls).parameters
        except ValueError:  # Exception's own constructor (SIEError, SIEConnectionError): the message only
            accepted = MappingProxyType({})
        error = cls(message, **{name: value for name, value in offered.items() if name in accepted})
        error.message = message
        error.code = reason or None
        error.status_code = offered["status_code"]
        error.grpc_code = grpc_code
        error.reason = reason
        error.metadata = metadata
        error._answered = True
        return error


class SIEConnectionError(SIEError):
    """The server could not be reached (UNAVAILABLE without a server reason: refused, reset, no route, TLS failed),
    or no connection came up within `connect_timeout_s`."""


class RequestError(SIEError):
    """The request is wrong (4xx: INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, auth): fix it, retrying will
    not help."""

    def __init__(
        self,
        message: str,
        code: str | None = None,
        status_code: int | None = None,
        *,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.param = param
        self.request = request


class ServerError(SIEError):
    """The server failed (5xx: INTERNAL, UNKNOWN, DEADLINE_EXCEEDED, UNAVAILABLE with a server reason, ...)."""

    def __init__(
        self,
        message: str,
        code: str | None = None,
        status_code: int | None = None,
        *,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code
        self.param = param
        self.request = request
        self.retry_after = retry_after


class ProvisioningError(SIEError):
    """No capacity for the request's machine profile yet (UNAVAILABLE / PROVISIONING), with waits off or run out."""

    def __init__(
        self,
        message: str,
        *,
        gpu: str | None = None,
        retry_after: float | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.gpu = gpu
        self.retry_after = retry_after
        self.param = param
        self.request = request


class ProvisioningTimeoutError(ProvisioningError):
    """Capacity did not arrive within `provision_timeout_s` (or a wait's `timeout_s`)."""


class PoolError(SIEError):
    """A pool call was refused (a reason naming pools: POOL_NOT_FOUND, POOLS_DISABLED, POOL_TOO_LARGE, ...).

    Each is also the class of its code: a missing pool is a PoolError and a NotFoundError."""

    def __init__(self, message: str, *, pool_name: str | None = None, state: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.pool_name = pool_name
        self.state = state


class LoraLoadingError(SIEError):
    """The LoRA adapter was still loading (UNAVAILABLE / LORA_LOADING) after the client's tries."""

    def __init__(
        self,
        message: str,
        *,
        lora: str | None = None,
        model: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.lora = lora
        self.model = model
        self.request = request


class ModelLoadingError(SIEError):
    """The model is still loading (UNAVAILABLE / MODEL_LOADING) and the client did not wait for it."""

    def __init__(self, message: str, *, model: str | None = None, request: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.request = request


class ModelLoadFailedError(ServerError):
    """The model's weights or adapter could not be loaded (FAILED_PRECONDITION / MODEL_LOAD_FAILED or
    LORA_LOAD_FAILED); `permanent` says whether the server will try again."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        error_class: str | None = None,
        permanent: bool = True,
        attempts: int = 1,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code="MODEL_LOAD_FAILED", status_code=502, param=param, request=request)
        self.model = model
        self.error_class = error_class
        self.permanent = permanent
        self.attempts = attempts


# Our earlier name of ModelLoadFailedError.
ModelLoadError = ModelLoadFailedError


class InputTooLongError(RequestError):
    """An input over the server's bound (INVALID_ARGUMENT / TEXT_TOO_LONG or PROMPT_TOO_LONG)."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code="INPUT_TOO_LONG", status_code=400, param=param, request=request)
        self.model = model


class RateLimitError(RequestError):
    """The reference's per-caller rate limit (HTTP 429 RATE_LIMIT). This engine has no per-caller rate limit, so
    the client never raises it; an overloaded server is a ResourceExhaustedError after the client's retries."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = "RATE_LIMIT",
        retry_after: float | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=429, param=param, request=request)
        self.retry_after = retry_after


class ResourceExhaustedError(ServerError):
    """The server stayed at capacity (RESOURCE_EXHAUSTED) through the client's retries."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        retries: int = 0,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            message, code="RESOURCE_EXHAUSTED", status_code=503, param=param, request=request, retry_after=retry_after
        )
        self.model = model
        self.retries = retries


class IncompleteBatchError(ServerError):
    """An answer with another number of results than the request had items (`results` holds those that came)."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        expected: int,
        received: int,
        model: str | None = None,
        missing_ids: list[str] | None = None,
        request: Mapping[str, Any] | None = None,
        results: Sequence[Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, request=request)
        self.expected = expected
        self.received = received
        self.model = model
        self.missing_ids = missing_ids
        self.results: list[Any] = list(results or ())


# --- ours -------------------------------------------------------------------------------------------------------


class NotFoundError(RequestError):
    """The model, profile, bundle or pool does not exist (NOT_FOUND)."""


class PreconditionError(RequestError):
    """The server cannot do this as configured (FAILED_PRECONDITION)."""


class AuthError(RequestError):
    """Missing or wrong credentials (UNAUTHENTICATED / PERMISSION_DENIED)."""


class UnavailableError(ServerError):
    """The server cannot serve now (UNAVAILABLE with a reason of its own: SHUTTING_DOWN, NO_LEADER, ...)."""


class NotSupportedError(SIEError, NotImplementedError):
    """A reference SDK feature this engine does not have (generation, jobs, status streams, ...), or an argument it
    cannot honour; the message says what to use instead. Raised before anything is sent."""


class ItemError(RequestError, ValueError):
    """An item the client cannot send (an unknown or unsupported field, or one of the wrong type); raised before any
    call. `metadata["field"]` names the field."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message, code="INVALID_ITEM_FIELD", status_code=400, param=field)
        self.grpc_code = grpc.StatusCode.INVALID_ARGUMENT
        self.reason = "INVALID_ITEM_FIELD"
        self.metadata = {"field": field}
        self._answered = True


# --- the reference's classes of its hosted service, for imports: this engine never raises them -----------------


class InsufficientCreditsError(RequestError):
    """The reference's hosted-service billing refusal (402); never raised here."""

    def __init__(self, message: str, *, param: str | None = None, request: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, code="INSUFFICIENT_CREDITS", status_code=402, param=param, request=request)


class SpendLimitError(RequestError):
    """The reference's hosted-service spend limit (402); never raised here."""

    def __init__(self, message: str, *, param: str | None = None, request: Mapping[str, Any] | None = None) -> None:
        super().__init__(message, code="KEY_SPEND_LIMIT_EXCEEDED", status_code=402, param=param, request=request)


class AccountInactiveError(RequestError):
    """The reference's hosted-service account state (403); never raised here."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=403, param=param, request=request)


class RelayUnavailableError(RequestError):
    """The reference's hosted-service regional relay (403); never raised here."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        key_region: str | None = None,
        deployment_region: str | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=403, param=param, request=request)
        self.key_region = key_region
        self.deployment_region = deployment_region


class AccountStateUnavailableError(ServerError):
    """The reference's hosted-service account lookup (503); never raised here."""

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            message,
            code="ACCOUNT_STATE_UNAVAILABLE",
            status_code=503,
            retry_after=retry_after,
            param=param,
            request=request,
        )


class EstimateUnroutableError(ServerError):
    """The reference's cost estimate refusal (503); this engine has no estimates, so it is never raised here."""

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status_code=503, param=param, request=request)


class JobFailedError(SIEError):
    """The reference's batch-job failure; this engine has no jobs, so it is never raised here."""

    def __init__(
        self,
        message: str,
        *,
        job_id: str | None = None,
        state: str | None = None,
        outcome: str | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.job_id = job_id
        self.state = state
        self.outcome = outcome
        self.error_code = error_code


class GatedModelError(Exception):
    """The reference server's error for a gated Hugging Face model (`sie_sdk.GatedModelError`); never raised by the
    client (a model that cannot be loaded is a ModelLoadFailedError)."""

    def __init__(self, model_id: str, original_error: Exception) -> None:
        super().__init__(f"model {model_id!r} is gated: {original_error}")
        self.model_id = model_id
        self.original_error = original_error


# --- which class an answer is --------------------------------------------------------------------------------------

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
    "MODEL_LOAD_FAILED": ModelLoadFailedError,
    "LORA_LOAD_FAILED": ModelLoadFailedError,
    "MODEL_LOADING": ModelLoadingError,
    "LORA_LOADING": LoraLoadingError,
    "PROVISIONING": ProvisioningError,
    "TEXT_TOO_LONG": InputTooLongError,
    "PROMPT_TOO_LONG": InputTooLongError,
}

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
