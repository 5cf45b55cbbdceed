"""What serves and for whom: the models, resource pools (leases renewed in the background) and capacity, with waits
for it; with the reference SDK's arguments and answers' shapes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NoReturn, cast

import grpc

from sie.v1 import inference_pb2
from sie_client import messages
from sie_client.connection import Connection
from sie_client.errors import NotFoundError, NotSupportedError, PoolError, ProvisioningTimeoutError, SIEError
from sie_client.types import CapacityInfo, ModelInfo, PoolInfo, WorkerInfo

NO_WORKER_PROFILES = (
    "this engine's API does not say which machine profile a worker has, so capacity cannot be counted per gpu; "
    "encode(..., gpu=..., wait_for_capacity=True) or wait_for_capacity(gpu, model=...) waits for that profile"
)


class PoolMethods(Connection):
    @functools.cached_property
    def _renewals(self) -> dict[str, asyncio.Task[None]]:
        """The background renewal of each pool this client created, by name."""
        return {}

    @functools.cached_property
    def _pool_created(self) -> asyncio.Lock:
        """Held while the pool given as a spec at construction is created (once)."""
        return asyncio.Lock()

    async def close(self) -> None:
        """Stop renewing pools (they then expire by themselves) and close the channel."""
        for name in list(self._renewals):
            self._stop_renewing(name)
        await super().close()

    async def list_models(self) -> list[ModelInfo]:
        """Each model as ModelInfo (state "loaded", profiles by name, last_error, ...) plus the server's own fields."""
        response = await self._call(self._stub.ListModels, inference_pb2.ListModelsRequest())
        return [messages.model_info(model) for model in response.models]

    async def get_model(self, model: str) -> ModelInfo:
        """One model as list_models() gives it ("model@profile" names the model); NotFoundError for an unknown one."""
        name = model.rpartition("@")[0] or model
        response = await self._call(self._stub.GetModel, inference_pb2.GetModelRequest(model=name))
        return messages.model_info(response.model)

    async def create_pool(
        self,
        name: str,
        gpus: Mapping[str, int] | None = None,
        gpu_caps: Mapping[str, int] | None = None,
        bundle: str | None = None,
        minimum_worker_count: int | None = None,
        pinned_models: Sequence[str] | None = None,
        *,
        queue_pool: str | None = None,
        min_workers: int = 0,
        ttl_s: int = 60,
        timeout_s: float = 300.0,
        poll_s: float = 0.5,
    ) -> PoolInfo:
        """Reserve workers (machine profile -> count; only of `bundle` when given) for requests routed to the pool
        (`pool=name`, or `gpu="name/profile"`); with `min_workers`, return once that many are assigned
        (ProvisioningTimeoutError after `timeout_s`; the pool is deleted when that wait fails, so it holds no workers
        or quota the caller does not know of).

        The lease is renewed in the background every third of `ttl_s` until `delete_pool` or `close`; after that
        the pool expires by itself. The reference's `gpu_caps`, `minimum_worker_count` (a warm floor),
        `pinned_models` and a `queue_pool` other than "default" have nothing to map to here: a NotSupportedError."""
        if minimum_worker_count is not None and minimum_worker_count < 0:
            raise ValueError(f"minimum_worker_count must be >= 0, not {minimum_worker_count}")
        for argument, given in (
            ("gpu_caps", gpu_caps),
            ("minimum_worker_count", minimum_worker_count),
            ("pinned_models", pinned_models),
            ("queue_pool", None if queue_pool in (None, "default") else queue_pool),
        ):
            if given:
                raise NotSupportedError(
                    f"create_pool({argument}=...): this engine's pools reserve `gpus` workers of an optional `bundle`"
                )
        gpus = dict(gpus or {})
        check_wait(timeout_s, poll_s)
        if min_workers > sum(gpus.values()):
            raise ValueError(f"min_workers={min_workers} is more than the {sum(gpus.values())} workers gpus= asks for")
        request = inference_pb2.CreatePoolRequest(name=name, gpus=gpus, ttl_s=ttl_s, bundle=bundle or "")
        response = await self._call(self._stub.CreatePool, request)
        self._stop_renewing(name)
        self._renewals[name] = asyncio.create_task(self._renew(name, max(ttl_s / 3, 0.2)))
        pool = messages.pool_info(response.pool)
        deadline = time.monotonic() + timeout_s
        try:
            while len(_workers(pool)) < min_workers:
                if time.monotonic() > deadline:
                    raise capacity_timeout(
                        f"pool {name!r} has {len(_workers(pool))} of min_workers={min_workers} workers after "
                        f"{timeout_s} s"
                    )
                await asyncio.sleep(poll_s)
                found = await self.get_pool(name)
                if found is None:
                    raise PoolError(f"pool {name!r} was deleted while waiting for its workers", pool_name=name)
                pool = found
        except BaseException:
            with contextlib.suppress(SIEError):
                await self.delete_pool(name)
            raise
        return pool

    async def get_pool(self, name: str | None = None) -> PoolInfo | None:
        """The pool (without a name: the one given as a spec at construction), or None when it does not exist."""
        name = name or self._spec_name()
        if not name:
            return None
        try:
            response = await self._call(self._stub.GetPool, inference_pb2.GetPoolRequest(name=name))
        except NotFoundError as missing:
            if missing.reason == "POOL_NOT_FOUND":
                return None
            raise
        return messages.pool_info(response.pool)

    async def delete_pool(self, name: str | None = None) -> bool:
        """Delete the pool (without a name: the one given as a spec at construction); False when it did not exist."""
        name = name or self._spec_name()
        if not name:
            return False
        self._stop_renewing(name)
        try:
            await self._call(self._stub.DeletePool, inference_pb2.DeletePoolRequest(name=name))
        except NotFoundError as missing:
            if missing.reason == "POOL_NOT_FOUND":
                return False
            raise
        return True

    def _spec_name(self) -> str | None:
        """The name of the pool given as a spec at construction (None without one)."""
        return self._pool_spec["name"] if self._pool_spec is not None else None

    async def _ensure_pool(self) -> None:
        """Create the pool given as a spec at construction, before the first call routed to it."""
        spec = self._pool_spec
        if spec is None or spec["name"] in self._renewals:
            return
        async with self._pool_created:
            if spec["name"] not in self._renewals:
                await self.create_pool(
                    spec["name"],
                    spec.get("gpus"),
                    spec.get("gpu_caps"),
                    spec.get("bundle"),
                    spec.get("minimum_worker_count"),
                    spec.get("pinned_models"),
                    queue_pool=spec.get("queue_pool"),
                )

    async def get_capacity(self, *, gpu: str | None = None) -> CapacityInfo:
        """What serves now, read from ListModels (and ListPools on a gateway), in the reference's shape: status,
        worker_count, gpu_count (one device per worker), models_loaded, workers (each with the models it has
        loaded and its bundle); plus ours: models {id: {loaded, loaded_on, state}} and pools. The API reports no
        idle workers and no machine profiles: a worker no model's bundle names is not counted, `gpu` of a worker
        is "", configured_gpu_types and live_gpu_types are empty, and `gpu=` is a NotSupportedError."""
        if gpu is not None:
            raise NotSupportedError(f"get_capacity(gpu={gpu!r}): {NO_WORKER_PROFILES}")
        models = [cast(dict[str, Any], model) for model in await self.list_models()]  # with the server's own keys
        try:
            pools = (await self._call(self._stub.ListPools, inference_pb2.ListPoolsRequest())).pools
            standalone = False
        except SIEError as error:
            if error.grpc_code != grpc.StatusCode.UNIMPLEMENTED:  # a standalone worker has no pools
                raise
            pools, standalone = [], True
        if standalone:  # the worker answering, whose id it does not report
            workers = [_worker("", "", [m["name"] for m in models if m["loaded"]])]
        else:
            bundles = {
                worker: rollout["bundle"]
                for m in models
                for rollout in m.get("rollouts", ())
                for worker in (*rollout.get("current_workers", ()), *rollout.get("lagging_workers", ()))
            }
            loaded_on = {name for m in models for name in m.get("loaded_on", ())}
            workers = [
                _worker(
                    worker, bundles.get(worker, ""), [m["name"] for m in models if worker in m.get("loaded_on", ())]
                )
                for worker in sorted(loaded_on | set(bundles))
            ]
        return CapacityInfo(
            status="healthy" if workers else "no_workers",
            worker_count=len(workers),
            gpu_count=len(workers),
            models_loaded=sum(1 for m in models if m["loaded"]),
            configured_gpu_types=[],
            live_gpu_types=[],
            workers=workers,
            models={
                m["name"]: {"loaded": m["loaded"], "loaded_on": m.get("loaded_on", []), "state": m["state"]}
                for m in models
            },
            pools=[messages.pool_info(pool) for pool in pools],
        )

    def watch(self, *, mode: Literal["auto", "cluster", "worker"] = "auto") -> NoReturn:
        """The reference's status stream (a WebSocket of worker and cluster status): this engine has none, so this
        raises NotSupportedError; get_capacity() and list_models() say what serves, Prometheus metrics the rest."""
        raise NotSupportedError(
            f"watch(mode={mode!r}): this engine has no status stream; poll get_capacity() or list_models(), or read "
            "the services' Prometheus metrics (docs/observability.md)"
        )

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


def _worker(name: str, bundle: str, loaded_models: list[str]) -> WorkerInfo:
    """A worker with what the API says of it; the reference's fields it has no source for keep empty values."""
    return WorkerInfo(
        name=name,
        url="",
        gpu="",
        gpu_count=1,
        ready_gpu_slots=1,
        healthy=True,
        queue_depth=0,
        pending_cost=0,
        inflight_batches=0,
        loaded_models=loaded_models,
        memory_used_bytes=0,
        memory_total_bytes=0,
        bundle=bundle,
        bundle_config_hash="",
    )


def _workers(pool: PoolInfo) -> list[Any]:
    return list(pool.get("status", {}).get("assigned_workers", ()))


def check_wait(timeout_s: float, poll_s: float, poll_name: str = "poll_s") -> None:
    """A wait that ends: NaN never compares past a deadline, and polling without a pause floods the server."""
    if not timeout_s >= 0:
        raise ValueError(f"timeout_s must be a number of seconds >= 0, not {timeout_s}")
    if not 0 < poll_s < math.inf:
        raise ValueError(f"{poll_name} must be a positive, finite number of seconds, not {poll_s}")


def capacity_timeout(message: str) -> ProvisioningTimeoutError:
    return ProvisioningTimeoutError.from_status(message, grpc_code=grpc.StatusCode.DEADLINE_EXCEEDED)
