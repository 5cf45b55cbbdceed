"""Bearer-token checks on gRPC metadata (`authorization: Bearer <token>`), in constant time.

Tokens never appear in errors or logs.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

import grpc

from sie_common.errors import PermissionDenied, Unauthenticated

_SCHEME = "bearer "


def bearer_token(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The token of the request's `authorization: Bearer ...` header, if there is one."""
    for key, value in metadata or ():
        if key.lower() == "authorization" and isinstance(value, str) and value[: len(_SCHEME)].lower() == _SCHEME:
            return value[len(_SCHEME):].strip()
    return None


def require_token(context: grpc.aio.ServicerContext, accepted: Iterable[str], *, what: str) -> None:
    """Raise UNAUTHENTICATED without a bearer token and PERMISSION_DENIED when it matches none of `accepted`."""
    token = bearer_token(context.invocation_metadata())
    if token is None:
        raise Unauthenticated(
            f"{what} needs an 'authorization: Bearer <token>' header",
            reason="MISSING_TOKEN",
        )
    presented = token.encode()
    # Compare against every accepted token so the time taken does not say which one was close.
    matches = [hmac.compare_digest(presented, candidate.encode()) for candidate in accepted]
    if not any(matches):
        raise PermissionDenied(f"the bearer token is not allowed to {what}", reason="INVALID_TOKEN")
