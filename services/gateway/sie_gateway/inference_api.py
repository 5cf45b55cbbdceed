"""sie.v1.Inference on the gateway: route each call to a worker's Work stream.

Every answer names the worker that served it in the `x-sie-worker` trailer
(EncodeStream answers carry it in their response's request_id tag instead:
one stream may be served by several workers).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import grpc
from google.rpc import status_pb2

from sie.v1 import inference_pb2, inference_pb2_grpc, worker_pb2
from sie_common.edge import openai_embeddings
from sie_common.edge.answer_size import MAX_SEND_SETTING, check_answer, check_encode_estimate
from sie_common.edge.auth import bearer_token
from sie_common.edge.encode_stream import EncodeStreams
from sie_common.edge.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    SieError,
    Unavailable,
    abort,
    abort_with_status,
    some_of,
)
from sie_common.edge.request_bounds import RequestBounds, check_name, check_request
from sie_common.edge.request_metrics import status_code
from sie_common.edge.request_params import merged_request
from sie_contract.tensors import SPELLED_OUT_VALUE_BYTES, spell_out_tensors
from sie_gateway.cluster_view import ClusterView
from sie_gateway.demand import DemandRecorder
from sie_gateway.dispatch import Dispatcher, NoWorker
from sie_gateway.metrics import REQUESTS
from sie_gateway.pools import PoolManager, check_pool_name
from sie_gateway.routing import eligible_workers
from sie_gateway.settings import GatewaySettings

MACHINE_PROFILE_HEADER = "x-sie-machine-profile"
POOL_HEADER = "x-sie-pool"
WORKER_TRAILER = "x-sie-worker"
# Envoy's gRPC-JSON transcoder sets it on the calls it made from HTTP/JSON requests.
TRANSCODED_HEADER = "x-envoy-original-path"
# Seconds a caller is told to wait while the gateway's view of the cluster is first read (a second or so).
STARTING_RETRY_S = 0.5


class GatewayInference(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        settings: GatewaySettings,
        view: ClusterView,
        dispatcher: Dispatcher,
        pools: PoolManager,
        demand: DemandRecorder,
    ) -> None:
        self._settings = settings
        self._streams = EncodeStreams(settings)
        self._view = view
        self._dispatcher = dispatcher
        self._pools = pools
        self._demand = demand
        self._bounds = RequestBounds(**RequestBounds.fields_from(settings))
        self.in_flight = 0

    async def Encode(
        self, request: inference_pb2.EncodeRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.EncodeResponse:
        return await self._unary(context, "encode", request)

    async def Score(
        self, request: inference_pb2.ScoreRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ScoreResponse:
        return await self._unary(context, "score", request)

    async def Extract(
        self, request: inference_pb2.ExtractRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ExtractResponse:
        return await self._unary(context, "extract", request)

    async def CreateEmbeddings(
        self, request: inference_pb2.CreateEmbeddingsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.CreateEmbeddingsResponse:
        try:
            encode = openai_embeddings.encode_request(request)
        except SieError as error:
            await abort(context, error)
        answer = await self._unary(context, "encode", encode, openai_embeddings.value_bytes(request))
        return openai_embeddings.embeddings_response(request, answer)

    async def EncodeStream(
        self, requests: AsyncIterator[inference_pb2.EncodeStreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.EncodeStreamResponse]:
        headers = _headers(context)

        async def encode(request: inference_pb2.EncodeRequest) -> inference_pb2.EncodeResponse | status_pb2.Status:
            with REQUESTS.observe("encode", request.model, request.request_id) as outcome, self._admitted():
                work = await self._route("encode", request, headers, self._deadline(context))
                if work.WhichOneof("outcome") == "error":
                    outcome.status = status_code(work.error.code)
                    return work.error
                return work.encode

        async for response in self._streams.serve(requests, encode, context):
            yield response

    async def ListModels(
        self, request: inference_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListModelsResponse:
        models = await self._guarded(context, lambda: [self._describe(model) for model in sorted(self._view.models)])
        return inference_pb2.ListModelsResponse(models=models)

    async def GetModel(
        self, request: inference_pb2.GetModelRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.GetModelResponse:
        return inference_pb2.GetModelResponse(
            model=await self._guarded(context, lambda: self._describe_named(request.model))
        )

    async def DescribeModel(
        self, request: inference_pb2.DescribeModelRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.Model:
        return await self._guarded(context, lambda: self._describe_named(request.model))

    async def CreatePool(
        self, request: inference_pb2.CreatePoolRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.CreatePoolResponse:
        token = bearer_token(context.invocation_metadata())
        pool = await self._guarded(
            context, lambda: self._pools.create(request.name, request.gpus, request.ttl_s, token, request.bundle)
        )
        return inference_pb2.CreatePoolResponse(pool=pool)

    async def GetPool(
        self, request: inference_pb2.GetPoolRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.GetPoolResponse:
        token = bearer_token(context.invocation_metadata())
        return inference_pb2.GetPoolResponse(
            pool=await self._guarded(context, lambda: self._pools.get(request.name, token))
        )

    async def ListPools(
        self, request: inference_pb2.ListPoolsRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.ListPoolsResponse:
        token = bearer_token(context.invocation_metadata())
        return inference_pb2.ListPoolsResponse(pools=await self._guarded(context, lambda: self._pools.owned_by(token)))

    async def RenewPool(
        self, request: inference_pb2.RenewPoolRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.RenewPoolResponse:
        token = bearer_token(context.invocation_metadata())
        return inference_pb2.RenewPoolResponse(
            pool=await self._guarded(context, lambda: self._pools.renew(request.name, token))
        )

    async def DeletePool(
        self, request: inference_pb2.DeletePoolRequest, context: grpc.aio.ServicerContext
    ) -> inference_pb2.DeletePoolResponse:
        token = bearer_token(context.invocation_metadata())
        await self._guarded(context, lambda: self._pools.delete(request.name, token))
        return inference_pb2.DeletePoolResponse()

    async def _guarded(self, context: grpc.aio.ServicerContext, call: Callable[[], Any]) -> Any:
        """Run `call` (awaiting what it returns if needed) once the view is read; SieErrors end the call with their
        status."""
        try:
            self._require_synced()
            result = call()
            return await result if inspect.isawaitable(result) else result
        except SieError as error:
            await abort(context, error)

    async def _unary(
        self, context: grpc.aio.ServicerContext, task: str, request: Any, value_bytes: int | None = None
    ) -> Any:
        """`value_bytes`: what one number of the answer will take once spelled out (JSON callers get every
        number in `values`); such an answer too large for one message is refused first, as a packed one is."""
        headers = _headers(context)
        transcoded = TRANSCODED_HEADER in headers
        if transcoded and value_bytes is None:
            value_bytes = SPELLED_OUT_VALUE_BYTES
        with REQUESTS.observe(task, request.model, request.request_id) as outcome:
            try:
                with self._admitted():
                    work = await self._route(task, request, headers, self._deadline(context), value_bytes)
            except SieError as error:
                outcome.failed(error)
                await abort(context, error)
            context.set_trailing_metadata(((WORKER_TRAILER, work.worker_id),))
            if work.WhichOneof("outcome") == "error":
                outcome.status = status_code(work.error.code)
                await abort_with_status(context, work.error)
            response = getattr(work, task)
            if transcoded:
                spell_out_tensors(response)
                try:
                    check_answer(response, self._settings.max_send_message_bytes, MAX_SEND_SETTING)
                except SieError as error:
                    outcome.failed(error)
                    await abort(context, error)
            return response

    async def _route(
        self, task: str, request: Any, headers: dict[str, str], deadline: float, value_bytes: int | None = None
    ) -> worker_pb2.WorkResponse:
        """The worker's answer: INVALID_ARGUMENT for a field over its bound before anything else, and
        RESOURCE_EXHAUSTED/RESPONSE_TOO_LARGE, never retried, for an answer this gateway may not send
        (`value_bytes` a number when it will be spelled out). `params` and the field-like `options` keys are
        folded into the fields first, so routing, the estimate and the worker's batch key see one shape."""
        request = merged_request(request, self._bounds)
        check_request(request, self._bounds)
        config = self._config(request.model)
        limit = self._settings.max_send_message_bytes
        if task == "encode":
            check_encode_estimate(request, config, limit, MAX_SEND_SETTING, value_bytes)
        work = await self._dispatch(task, request, config, headers, deadline)
        if work.WhichOneof("outcome") == task:
            check_answer(getattr(work, task), limit, MAX_SEND_SETTING)
        return work

    async def _dispatch(
        self, task: str, request: Any, config: Any, headers: dict[str, str], deadline: float
    ) -> worker_pb2.WorkResponse:
        bundles = self._view.bundles_for(config)
        if not bundles:
            raise FailedPrecondition(
                f"no bundle can serve {request.model} (adapter {config.profile().adapter})",
                reason="NO_BUNDLE_FOR_MODEL",
            )
        profile = headers.get(MACHINE_PROFILE_HEADER, "")
        pool = headers.get(POOL_HEADER, "")
        check_name(MACHINE_PROFILE_HEADER, profile, self._bounds)
        if pool:
            check_pool_name(pool, self._bounds, POOL_HEADER)
        if pool and pool not in self._view.pools and not any(w.pool == pool for w in self._view.workers.values()):
            raise NotFound(
                f"pool {pool!r} does not exist (or expired)", reason="POOL_NOT_FOUND", metadata={"pool": pool}
            )
        if pool:
            self._pools.check_use(pool, bearer_token(headers.items()))

        def candidates(tried: Any) -> list:
            return eligible_workers(
                list(self._view.workers.values()), bundles=bundles, machine_profile=profile, pool=pool, exclude=tried
            )

        try:
            return await self._dispatcher.dispatch(
                task, request, model=request.model, candidates=candidates, deadline=deadline
            )
        except NoWorker as error:
            if error.tried:
                raise Unavailable(
                    f"every worker tried for {request.model} went away ({', '.join(error.tried)}); retry",
                    reason="WORKERS_LOST",
                    retry_after_s=1.0,
                ) from None
            await self._no_capacity(request.model, profile, pool)
            raise AssertionError("unreachable") from None

    async def _no_capacity(self, model: str, profile: str, pool: str) -> None:
        known = set(self._settings.configured_gpus) | {w.machine_profile for w in self._view.workers.values()}
        if profile and profile not in known:
            raise FailedPrecondition(
                f"machine profile {profile!r} is not configured; configured: {some_of(known)}",
                reason="UNKNOWN_MACHINE_PROFILE",
                metadata={"machine_profile": profile},
            )
        await self._demand.record(profile, pool)
        where = f"machine profile {profile!r}" if profile else "any machine profile"
        raise Unavailable(
            f"no worker of {where}{f' in pool {pool!r}' if pool else ''} is up for {model}; capacity is being "
            f"provisioned",
            reason="PROVISIONING",
            retry_after_s=self._settings.provisioning_retry_s,
            metadata={"machine_profile": profile, "pool": pool},
        )

    def _require_synced(self) -> None:
        """The server answers while the view still reads etcd (its health says NOT_SERVING): models without their
        bundles or workers would read as permanent failures."""
        if not self._view.synced:
            raise Unavailable(
                "this gateway is still reading the cluster's models and workers; retry",
                reason="GATEWAY_STARTING",
                retry_after_s=STARTING_RETRY_S,
            )

    def _config(self, model: str) -> Any:
        if not model:
            raise InvalidArgument("model is required", reason="MISSING_MODEL")
        self._require_synced()
        config = self._view.models.get(model)
        if config is None:
            raise NotFound(
                f"model {model!r} is not configured; available: {some_of(self._view.models)}",
                reason="MODEL_NOT_FOUND",
                metadata={"model": model},
            )
        return config

    def _describe_named(self, model_id: str) -> inference_pb2.Model:
        """The model a caller named: the name within SIE_MAX_NAME_BYTES before an error quotes it."""
        check_name("model", model_id, self._bounds)
        return self._describe(model_id)

    def _describe(self, model_id: str) -> inference_pb2.Model:
        config = self._config(model_id)
        workers = self._view.workers.values()
        loaded_on = sorted(w.worker_id for w in workers if model_id in w.loaded_models)
        rollouts = []
        for bundle in self._view.bundles_for(config):
            expected = self._view.expected_hashes[bundle]
            members = sorted((w for w in workers if w.bundle == bundle), key=lambda w: w.worker_id)
            rollouts.append(
                inference_pb2.ModelRollout(
                    bundle=bundle,
                    config_hash=expected,
                    current_workers=[w.worker_id for w in members if w.bundle_config_hash == expected],
                    lagging_workers=[w.worker_id for w in members if w.bundle_config_hash != expected],
                )
            )
        return inference_pb2.Model(
            id=config.id,
            tasks=config.tasks,
            output_types=config.output_types,
            dims=config.dims or 0,
            max_sequence_length=config.max_sequence_length or 0,
            profiles=sorted(config.profiles),
            inputs=config.inputs,
            state=inference_pb2.MODEL_STATE_LOADED if loaded_on else inference_pb2.MODEL_STATE_AVAILABLE,
            rollouts=rollouts,
            loaded_on=loaded_on,
        )

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        if self.in_flight >= self._settings.max_in_flight:
            raise ResourceExhausted(
                f"gateway at capacity: {self._settings.max_in_flight} requests in flight "
                f"(SIE_GATEWAY_MAX_IN_FLIGHT); retry",
                reason="GATEWAY_BUSY",
                retry_after_s=0.5,
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def _deadline(self, context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        return time.monotonic() + (remaining if remaining is not None else self._settings.request_timeout_s)


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}
