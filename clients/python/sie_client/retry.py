"""When the client tries a failed call again, and after how long; and the loop that does it for a unary call."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from sie_client.errors import ProvisioningTimeoutError
from sie_client.status import CallSite, CallStatus, call_status, explained

Response = TypeVar("Response")
# gRPC call metadata: (key, value) pairs.
Metadata = tuple[tuple[str, str], ...]

# UNAVAILABLE reasons that mean "capacity is on its way": waited out with wait_for_capacity.
CAPACITY_REASONS = frozenset({"PROVISIONING", "MODEL_LOADING"})
# RESOURCE_EXHAUSTED reason of an item that did not fit in device memory even alone (the worker already split its
# batch).
OOM_REASON = "DEVICE_OUT_OF_MEMORY"
# RESOURCE_EXHAUSTED reasons the same call would get again (the answer is too large, the caller's pool quota is held).
FINAL_EXHAUSTED_REASONS = frozenset({"RESPONSE_TOO_LARGE", "POOL_QUOTA_EXCEEDED"})
# grpc's own RESOURCE_EXHAUSTED (no reason) for a message or trailers over a size limit: final too.
_SIZE_REFUSALS = ("message larger than max", "metadata size exceeds")


@dataclass(frozen=True)
class RetryPolicy:
    wait_for_capacity: bool = True
    # How long to wait for capacity (PROVISIONING, MODEL_LOADING) in all.
    provision_timeout_s: float = 300.0
    # Tries while a LoRA adapter loads.
    lora_loading_attempts: int = 10
    # Retries (after the first try) of an answer out of device memory, backing off: the memory others held
    # may be free by then. The reference SDK's max_oom_retries.
    max_oom_retries: int = 3
    # Tries on RESOURCE_EXHAUSTED (and UNAVAILABLE without a retry delay), backing off.
    busy_attempts: int = 8
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 2.0

    def __post_init__(self) -> None:
        if not (self.provision_timeout_s >= 0):  # NaN too
            raise ValueError(f"provision_timeout_s must be a number of seconds >= 0, not {self.provision_timeout_s}")
        if self.max_oom_retries < 0:
            raise ValueError(f"max_oom_retries must be >= 0, not {self.max_oom_retries}")

    def delay(self, status: CallStatus, attempt: int, waited_s: float) -> float | None:
        """Seconds to wait before try `attempt + 1`, or None to give up. `attempt` counts from 1."""
        hinted = status.retry_after_s
        if status.code == grpc.StatusCode.UNAVAILABLE:
            if status.reason in CAPACITY_REASONS:
                if not self.wait_for_capacity:
                    return None
                delay = hinted if hinted is not None else 1.0
                return delay if waited_s + delay <= self.provision_timeout_s else None
            if status.reason == "LORA_LOADING":
                return (hinted if hinted is not None else 0.5) if attempt < self.lora_loading_attempts else None
            if hinted is not None:
                return hinted if attempt < self.busy_attempts else None
            return self._backoff(attempt)
        if status.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            if status.reason in FINAL_EXHAUSTED_REASONS or (
                not status.reason and any(s in status.message for s in _SIZE_REFUSALS)
            ):
                return None
            if status.reason == OOM_REASON:
                return None if attempt > self.max_oom_retries else max(self._jittered(attempt), hinted or 0.0)
            backoff = self._backoff(attempt)
            return None if backoff is None else max(backoff, hinted or 0.0)
        return None

    def _backoff(self, attempt: int) -> float | None:
        return None if attempt >= self.busy_attempts else self._jittered(attempt)

    def _jittered(self, attempt: int) -> float:
        ceiling = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(attempt - 1, 32))
        return ceiling * random.uniform(0.5, 1.0)  # jitter: callers that failed together retry apart


# The policy of calls that take no per-call settings (model lookups, pools): every default.
DEFAULT_POLICY = RetryPolicy()


async def call_with_retries(
    method: Callable[..., Awaitable[Response]],
    request: Any,
    policy: RetryPolicy,
    *,
    metadata: Metadata,
    site: CallSite,
) -> Response:
    """One unary call with the deadline `site.timeout_s`, tried again as `policy` says; the last failure raised as its
    SIEError."""
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await method(request, metadata=metadata, timeout=site.timeout_s)
        except grpc.aio.AioRpcError as error:
            status = call_status(error)
        await asyncio.sleep(delay_or_raise(status, policy, attempt, started, site))


def delay_or_raise(status: CallStatus, policy: RetryPolicy, attempt: int, started: float, site: CallSite) -> float:
    """Seconds to wait before trying the failed call again, or the error that ends it (ProvisioningTimeoutError once
    a capacity wait has run out; grpc's own statuses explained for `site`)."""
    waited = time.monotonic() - started
    delay = policy.delay(status, attempt, waited)
    if delay is not None:
        return delay
    if policy.wait_for_capacity and status.reason in CAPACITY_REASONS:
        raise ProvisioningTimeoutError.from_status(
            f"no capacity after {waited:.1f} s (provision_timeout_s={policy.provision_timeout_s}): {status.message}",
            grpc_code=status.code,
            reason=status.reason,
            metadata=status.metadata,
            retry_after=status.retry_after_s,
        )
    raise explained(status, site).error()
