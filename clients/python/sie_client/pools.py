"""What serves and for whom: the models, resource pools (leases renewed in the background) and capacity, with waits
for it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Mapping
from typing import Any

import grpc

from sie.v1 import inference_pb2
from sie_client import messages
from sie_client.connection import Connection
from sie_client.errors import ProvisioningTimeoutError, SIEError
from sie_client.retry import RetryPolicy


class PoolMethods(Connection):
    @functools.cached_property
    def _renewals(self) -> dict[str, asyncio.Task[None]]:
        """The background renewal of each pool this client created, by name."""
        return {}

    async def close(self) -> None:
        """Stop renewing pools (they then expire by themselves) and close the channel."""
        for name in list(self._renewals):
            self._stop_renewing(name)
        await super().close()

    async def list_models(self) -> list[dict[str, Any]]:
        """Each model: the proto's fields plus `name`, `outputs`, `dims` per output and `loaded`."""
        response = await self._call(self._stub.ListModels, inference_pb2.ListModelsRequest(), RetryPolicy())
        return [messages.model_dict(model) for model in response.models]

    async def get_model(self, model: str) -> dict[str, Any]:
        response = await self._call(self._stub.GetModel, inference_pb2.GetModelRequest(model=model), RetryPolicy())
        return messages.model_dict(response.model)

    async def create_pool(
        self,
        name: str,
        gpus: Mapping[str, int],
        *,
        bundle: str | None = None,
        min_workers: int = 0,
        ttl_s: int = 60,
        timeout_s: float = 300.0,
        poll_s: float = 0.5,
    ) -> dict[str, Any]:
        """Reserve workers (machine profile -> count; only of `bundle` when given) for `pool` requests; with
        `min_workers`, return once that many are assigned (ProvisioningTimeoutError after `timeout_s`; the pool
        is deleted when that wait fails, so it holds no workers or quota the caller does not know of).

        The lease is renewed in the background every third of `ttl_s` until
        `delete_pool` or `close`; after that the pool expires by itself."""
        _check_wait(timeout_s, poll_s)
        if min_workers > sum(gpus.values()):
            raise ValueError(f"min_workers={min_workers} is more than the {sum(gpus.values())} workers gpus= asks for")
        request = inference_pb2.CreatePoolRequest(name=name, gpus=dict(gpus), ttl_s=ttl_s, bundle=bundle or "")
        response = await self._call(self._stub.CreatePool, request, RetryPolicy())
        self._stop_renewing(name)
        self._renewals[name] = asyncio.create_task(self._renew(name, max(ttl_s / 3, 0.2)))
        pool = messages.as_dict(response.pool)
        deadline = time.monotonic() + timeout_s
        try:
            while len(pool.get("workers", ())) < min_workers:
                if time.monotonic() > deadline:
                    raise _capacity_timeout(
                        f"pool {name!r} has {len(pool.get('workers', ()))} of min_workers={min_workers} workers "
                        f"after {timeout_s} s"
                    )
                await asyncio.sleep(poll_s)
                pool = await self.get_pool(name)
        except BaseException:
            with contextlib.suppress(SIEError):
                await self.delete_pool(name)
            raise
        return pool

    async def get_pool(self, name: str) -> dict[str, Any]:
        response = await self._call(self._stub.GetPool, inference_pb2.GetPoolRequest(name=name), RetryPolicy())
        return messages.as_dict(response.pool)

    async def delete_pool(self, name: str) -> None:
        self._stop_renewing(name)
        await self._call(self._stub.DeletePool, inference_pb2.DeletePoolRequest(name=name), RetryPolicy())

    async def get_capacity(self) -> dict[str, Any]:
        """What serves now, from ListModels (and ListPools on a gateway): {"models": {id: {"loaded", "loaded_on",
        "state"}}, "workers": ids of the workers with a model in memory, "pools": [...]}. The API reports no idle
        workers or machine profiles, so a worker with nothing loaded is not listed."""
        models = await self.list_models()
        try:
            pools = (await self._call(self._stub.ListPools, inference_pb2.ListPoolsRequest(), RetryPolicy())).pools
        except SIEError as error:
            if error.code != grpc.StatusCode.UNIMPLEMENTED:  # a standalone worker has no pools
                raise
            pools = []
        return {
            "models": {
                m["id"]: {"loaded": m["loaded"], "loaded_on": m.get("loaded_on", []), "state": m.get("state", "")}
                for m in models
            },
            "workers": sorted({worker for m in models for worker in m.get("loaded_on", ())}),
            "pools": [messages.as_dict(pool) for pool in pools],
        }

    async def wait_for_capacity(
        self, model: str | None = None, *, timeout_s: float = 300.0, poll_s: float = 0.5
    ) -> dict[str, Any]:
        """Poll get_capacity until `model` (or, without one, any model) is loaded somewhere, and return it;
        ProvisioningTimeoutError after `timeout_s`. Loading starts with a model's first request (or preloading)."""
        _check_wait(timeout_s, poll_s)
        deadline = time.monotonic() + timeout_s
        while True:
            capacity = await self.get_capacity()
            states = capacity["models"]
            if model is not None and model not in states:
                await self.get_model(model)  # NotFoundError for a model that is not configured
            if any(state["loaded"] for name, state in states.items() if model in (None, name)):
                return capacity
            if time.monotonic() > deadline:
                raise _capacity_timeout(f"{model or 'no model'} is loaded nowhere after {timeout_s} s")
            await asyncio.sleep(poll_s)

    async def _renew(self, name: str, every_s: float) -> None:
        """Until stopped, or until the pool is gone (expired, deleted) or not this caller's: a renewer left running
        would keep alive a pool created later under the same name."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._stub.RenewPool(
                    inference_pb2.RenewPoolRequest(name=name), metadata=self._metadata, timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError as error:
                if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED):
                    if self._renewals.get(name) is asyncio.current_task():
                        del self._renewals[name]
                    return

    def _stop_renewing(self, name: str) -> None:
        task = self._renewals.pop(name, None)
        if task is not None:
            task.cancel()


def _check_wait(timeout_s: float, poll_s: float) -> None:
    """A wait that ends: NaN never compares past a deadline, and polling without a pause floods the server."""
    if not timeout_s >= 0:
        raise ValueError(f"timeout_s must be a number of seconds >= 0, not {timeout_s}")
    if not 0 < poll_s < math.inf:
        raise ValueError(f"poll_s must be a positive, finite number of seconds, not {poll_s}")


def _capacity_timeout(message: str) -> ProvisioningTimeoutError:
    return ProvisioningTimeoutError(message, code=grpc.StatusCode.DEADLINE_EXCEEDED)
