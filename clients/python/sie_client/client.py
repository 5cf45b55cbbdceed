"""The clients and the errors they raise, as the reference SDK's `sie_sdk.client` has them."""

from sie_client.async_client import AsyncSIEClient
from sie_client.errors import (
    AccountInactiveError,
    AccountStateUnavailableError,
    EstimateUnroutableError,
    IncompleteBatchError,
    InputTooLongError,
    InsufficientCreditsError,
    JobFailedError,
    LoraLoadingError,
    ModelLoadFailedError,
    ModelLoadingError,
    PoolError,
    ProvisioningError,
    RateLimitError,
    RelayUnavailableError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEConnectionError,
    SIEError,
    SpendLimitError,
)
from sie_client.sync_client import SIEClient

# The reference SDK's name for the async client.
SIEAsyncClient = AsyncSIEClient

__all__ = [
    "AccountInactiveError",
    "AccountStateUnavailableError",
    "AsyncSIEClient",
    "EstimateUnroutableError",
    "IncompleteBatchError",
    "InputTooLongError",
    "InsufficientCreditsError",
    "JobFailedError",
    "LoraLoadingError",
    "ModelLoadFailedError",
    "ModelLoadingError",
    "PoolError",
    "ProvisioningError",
    "RateLimitError",
    "RelayUnavailableError",
    "RequestError",
    "ResourceExhaustedError",
    "SIEAsyncClient",
    "SIEClient",
    "SIEConnectionError",
    "SIEError",
    "ServerError",
    "SpendLimitError",
]
