"""The SIE Python client: encode, score and extract with numpy results.

from sie_client import SIEClient, Item
client = SIEClient("http://localhost:8080")  # or "localhost:50061", or base_url=...
vector = client.encode("sentence-transformers/all-MiniLM-L6-v2", Item(text="hello"))["dense"]
"""

from sie_client.client import AsyncSIEClient
from sie_client.errors import (
    AuthError,
    ItemError,
    LoraLoadingError,
    ModelLoadError,
    ModelLoadFailedError,
    ModelLoadingError,
    NotFoundError,
    PoolError,
    PreconditionError,
    ProvisioningError,
    ProvisioningTimeoutError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEConnectionError,
    SIEError,
    UnavailableError,
)
from sie_client.sync_client import SIEClient
from sie_client.types import (
    Classification,
    DetectedObject,
    EncodeResult,
    Entity,
    ExtractResult,
    Item,
    Relation,
    ScoreEntry,
    ScoreResult,
    Timing,
    dequantize,
)

# The reference SDK's name for the async client.
SIEAsyncClient = AsyncSIEClient

__all__ = [
    "AsyncSIEClient",
    "AuthError",
    "Classification",
    "DetectedObject",
    "EncodeResult",
    "Entity",
    "ExtractResult",
    "Item",
    "ItemError",
    "LoraLoadingError",
    "ModelLoadError",
    "ModelLoadFailedError",
    "ModelLoadingError",
    "NotFoundError",
    "PoolError",
    "PreconditionError",
    "ProvisioningError",
    "ProvisioningTimeoutError",
    "Relation",
    "RequestError",
    "ResourceExhaustedError",
    "SIEAsyncClient",
    "SIEClient",
    "SIEConnectionError",
    "SIEError",
    "ScoreEntry",
    "ScoreResult",
    "ServerError",
    "Timing",
    "UnavailableError",
    "dequantize",
]
