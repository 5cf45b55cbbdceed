"""The client's retry decisions for each status and reason."""

from __future__ import annotations

import grpc
import pytest

from sie_client.retry import RetryPolicy
from sie_client.status import CallStatus

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def status(code: grpc.StatusCode, reason: str = "", retry_after_s: float | None = None) -> CallStatus:
    return CallStatus(code, "message", reason, {}, retry_after_s)


@pytest.mark.parametrize("reason", ["PROVISIONING", "MODEL_LOADING"])
def test_capacity_waits_follow_the_server_delay_until_the_timeout(reason: str) -> None:
    policy = RetryPolicy(provision_timeout_s=10)
    assert policy.delay(status(UNAVAILABLE, reason, 2.5), attempt=1, waited_s=0) == 2.5
    assert policy.delay(status(UNAVAILABLE, reason, 2.5), attempt=40, waited_s=7.5) == 2.5
    assert policy.delay(status(UNAVAILABLE, reason, 2.5), attempt=4, waited_s=8.0) is None
    assert RetryPolicy(wait_for_capacity=False).delay(status(UNAVAILABLE, reason, 2.5), attempt=1, waited_s=0) is None


def test_lora_loading_is_retried_a_bounded_number_of_times() -> None:
    policy = RetryPolicy(lora_loading_attempts=3)
    assert policy.delay(status(UNAVAILABLE, "LORA_LOADING", 0.2), attempt=2, waited_s=0) == 0.2
    assert policy.delay(status(UNAVAILABLE, "LORA_LOADING", 0.2), attempt=3, waited_s=0) is None


def test_resource_exhausted_backs_off_with_a_cap_and_gives_up() -> None:
    policy = RetryPolicy(busy_attempts=6, backoff_initial_s=0.1, backoff_max_s=0.5)
    delays = [policy.delay(status(grpc.StatusCode.RESOURCE_EXHAUSTED), attempt=n, waited_s=0) for n in range(1, 7)]
    assert all(d is not None and d <= 0.5 for d in delays[:5])
    assert delays[0] <= 0.1 and delays[4] >= 0.25  # grows, with jitter of at most half
    assert delays[5] is None


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAUTHENTICATED],
)
def test_request_errors_are_never_retried(code: grpc.StatusCode) -> None:
    assert RetryPolicy().delay(status(code, "ANY", 1.0), attempt=1, waited_s=0) is None


def test_out_of_device_memory_is_retried_max_oom_retries_times() -> None:
    oom = status(grpc.StatusCode.RESOURCE_EXHAUSTED, "DEVICE_OUT_OF_MEMORY")
    policy = RetryPolicy(max_oom_retries=2)
    assert [policy.delay(oom, attempt=n, waited_s=0) is not None for n in (1, 2, 3)] == [True, True, False]
    assert RetryPolicy(max_oom_retries=0).delay(oom, attempt=1, waited_s=0) is None
    # Other RESOURCE_EXHAUSTED answers keep their own budget.
    assert RetryPolicy(max_oom_retries=0).delay(status(grpc.StatusCode.RESOURCE_EXHAUSTED, "QUEUE_FULL"), attempt=1, waited_s=0) is not None


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("RESPONSE_TOO_LARGE", "the answer takes 20000000 bytes"),
        ("POOL_QUOTA_EXCEEDED", "pool quota: this caller's pools hold 3 workers"),
        ("", "Received message larger than max (20000047 vs. 16777216)"),
        ("", "Sent message larger than max (70000000 vs. 67108864)"),
        ("", "Stream removed (received metadata size exceeds hard limit (21402 vs. 16384))"),
    ],
)
def test_resource_exhausted_that_the_same_call_would_get_again_is_not_retried(reason: str, message: str) -> None:
    refused = CallStatus(grpc.StatusCode.RESOURCE_EXHAUSTED, message, reason)
    assert RetryPolicy().delay(refused, attempt=1, waited_s=0) is None


def test_max_oom_retries_is_not_capped_by_the_busy_budget_and_never_overflows() -> None:
    oom = status(grpc.StatusCode.RESOURCE_EXHAUSTED, "DEVICE_OUT_OF_MEMORY")
    policy = RetryPolicy(max_oom_retries=10**6, busy_attempts=8, backoff_max_s=2.0)
    assert all(0 < policy.delay(oom, attempt=n, waited_s=0) <= 2.0 for n in (8, 9, 2000, 10**6))
    assert policy.delay(oom, attempt=10**6 + 1, waited_s=0) is None


@pytest.mark.parametrize("kwargs", [{"provision_timeout_s": float("nan")}, {"provision_timeout_s": -1.0}, {"max_oom_retries": -1}])
def test_a_nan_or_negative_retry_budget_is_a_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RetryPolicy(**kwargs)
