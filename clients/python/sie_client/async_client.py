"""AsyncSIEClient (the reference's SIEAsyncClient): the three verbs, models, pools and capacity over grpc.aio.

Works against a gateway, a standalone worker and Envoy's HTTP port alike. Its parts, one module each: the set-up
(connection.py), the verbs (verbs.py), models, pools and capacity (pools.py), retries (retry.py: capacity waits
until `provision_timeout_s`, LORA_LOADING a bounded number of times, out of device memory `max_oom_retries` times,
RESOURCE_EXHAUSTED with capped backoff, request errors never) and long lists sent in windows (streaming.py).
"""

from __future__ import annotations

import asyncio
import time

from sie_client.errors import NotSupportedError
from sie_client.pools import NO_WORKER_PROFILES, capacity_timeout, check_wait
from sie_client.types import CapacityInfo
from sie_client.verbs import DEFAULT_PROVISION_TIMEOUT_S, VerbMethods, model_and_profile


class AsyncSIEClient(VerbMethods):
    """The client: `AsyncSIEClient(base_url, ...)` (see Connection for the arguments), as an async context manager."""

    async def wait_for_capacity(
        self,
        gpu: str,
        *,
        model: str | None = None,
        timeout_s: float | None = None,
        poll_interval_s: float = 5.0,
    ) -> CapacityInfo:
        """Wait until `model` serves on machine profile `gpu` (or "pool/profile"): one encode of "warmup" routed
        there, waiting out scale from zero and the model's load, then get_capacity() every `poll_interval_s` until it
        lists the model as loaded (a gateway learns that from the worker's next report), all within `timeout_s`
        (default 900 s; then ProvisioningTimeoutError). Returns that capacity. Without a model: a
        NotSupportedError, since the API does not say which profile a worker has."""
        wait_s = DEFAULT_PROVISION_TIMEOUT_S if timeout_s is None else timeout_s
        check_wait(wait_s, poll_interval_s, "poll_interval_s")
        if model is None:
            raise NotSupportedError(f"wait_for_capacity({gpu!r}) without model=: {NO_WORKER_PROFILES}")
        deadline = time.monotonic() + wait_s
        await self.encode(model, {"text": "warmup"}, gpu=gpu, wait_for_capacity=True, provision_timeout_s=wait_s)
        name = model_and_profile(model, None)[0]
        while not (capacity := await self.get_capacity())["models"].get(name, {}).get("loaded"):
            if time.monotonic() > deadline:
                raise capacity_timeout(f"{model} answered but is listed as loaded nowhere after {wait_s} s")
            await asyncio.sleep(poll_interval_s)
        return capacity
