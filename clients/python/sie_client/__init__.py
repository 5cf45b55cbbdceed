"""The SIE Python client: encode, score and extract with numpy results.

    from sie_client import SIEClient, Item
    client = SIEClient("localhost:50061")
    vector = client.encode("sentence-transformers/all-MiniLM-L6-v2", Item(text="hello"))["dense"]
"""

from sie_client.client import AsyncSIEClient
from sie_client.errors import (
    AuthError,
    ModelLoadError,
    NotFoundError,
    PreconditionError,
    ProvisioningError,
    ProvisioningTimeoutError,
    RequestError,
    ResourceExhaustedError,
    ServerError,
    SIEError,
    UnavailableError,
)
from sie_client.sync_client import SIEClient
from sie_client.types import EncodeResult, Entity, ExtractResult, Item, ScoreEntry, ScoreResult, Timing, dequantize

__all__ = [
    "AsyncSIEClient",
    "AuthError",
    "EncodeResult",
    "Entity",
    "ExtractResult",
    "Item",
    "ModelLoadError",
    "NotFoundError",
    "PreconditionError",
    "ProvisioningError",
    "ProvisioningTimeoutError",
    "RequestError",
    "ResourceExhaustedError",
    "SIEClient",
    "SIEError",
    "ScoreEntry",
    "ScoreResult",
    "ServerError",
    "Timing",
    "UnavailableError",
    "dequantize",
]
