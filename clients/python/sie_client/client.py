"""AsyncSIEClient: the engine's three verbs, model listing, pools and capacity over grpc.aio.

Works against a gateway, a standalone worker and Envoy's HTTP port alike. Its parts, one module each: the set-up
(connection.py), the verbs (verbs.py), models, pools and capacity (pools.py), retries (retry.py: capacity waits
until `provision_timeout_s`, LORA_LOADING a bounded number of times, out of device memory `max_oom_retries` times,
RESOURCE_EXHAUSTED with capped backoff, request errors never) and long lists sent in windows (streaming.py).
"""

from __future__ import annotations

from sie_client.pools import PoolMethods
from sie_client.verbs import VerbMethods


class AsyncSIEClient(VerbMethods, PoolMethods):
    """The client: `AsyncSIEClient(target, ...)` (see Connection for the arguments), as an async context manager."""
