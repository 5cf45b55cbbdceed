"""AsyncSIEClient: the engine's three verbs, model listing, pools and capacity over grpc.aio.

Works against a gateway, a standalone worker and Envoy's HTTP port alike. Retries
follow RetryPolicy: capacity waits (PROVISIONING, MODEL_LOADING) honour the
server's RetryInfo delay until `provision_timeout_s`; LORA_LOADING a bounded
number of times; out of device memory `max_oom_retries` times; RESOURCE_EXHAUSTED
with capped backoff; request errors never.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypedDict, TypeVar, Unpack, overload

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from sie_client import messages
from sie_client.errors import ProvisioningTimeoutError, ServerError, SIEError
from sie_client.messages import ItemLike, as_batch, is_single
from sie_client.retry import CAPACITY_REASONS, RetryPolicy
from sie_client.status import CallStatus, call_status, status_from_proto
from sie_client.target import parse_target
from sie_client.types import EncodeResult, ExtractResult, ScoreResult

Response = TypeVar("Response")


# The keyword arguments of encode and extract, for their overloads (which tell one item from a list): mypy checks
# that the implementations accept each of them with its type.
class _CallOptions(TypedDict, total=False):
    """What every encode and extract call may say: the model's profile and LoRA, raw options, routing and retries."""

    profile: str | None
    lora: str | None
    options: Mapping[str, Any] | None
    gpu: str | None
    pool: str | None
    wait_for_capacity: bool
    provision_timeout_s: float
    max_oom_retries: int
    debug: bool


class EncodeOptions(_CallOptions, total=False):
    output_types: Sequence[str] | None
    output_dtype: str | None
    instruction: str | None
    is_query: bool
    dims: int | None
    progress: bool


class ExtractOptions(_CallOptions, total=False):
    labels: Sequence[str] | None
    threshold: float | None


MAX_MESSAGE_BYTES = 64 * 1024 * 1024
MACHINE_PROFILE_HEADER = "x-sie-machine-profile"
POOL_HEADER = "x-sie-pool"


class AsyncSIEClient:
    def __init__(
        self,
        target: str | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        gpu: str | None = None,
        pool: str | None = None,
        options: Mapping[str, Any] | None = None,
        stream_batch_size: int = 256,
        stream_window: int = 8,
        tls: bool = False,
        root_certificates: bytes | None = None,
        certificate_chain: bytes | None = None,
        private_key: bytes | None = None,
    ) -> None:
        """`target` (or `base_url=`) is host:port or an http(s):// URL of a worker, a gateway or Envoy.
        `gpu` picks a machine profile and `pool` a resource pool on a gateway (defaults for each call's
        own); `options` are defaults merged under each call's own. Lists longer than
        `stream_batch_size` are sent as several requests, `stream_window` at a time, on one stream.
        TLS is on with an https:// URL, `tls=True` or any of the PEM arguments: `root_certificates` to
        trust (default: the system's), `certificate_chain` and `private_key` for mutual TLS."""
        if (target is None) == (base_url is None):
            raise ValueError("give the server as `target` or as `base_url=`, once")
        if not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a positive, finite number of seconds, not {timeout_s}")
        if stream_batch_size < 1 or stream_window < 1:  # a window of 0 would never send a request
            raise ValueError(
                f"stream_batch_size and stream_window must be >= 1, not {stream_batch_size} and {stream_window}"
            )
        tls = tls or bool(root_certificates or certificate_chain or private_key)
        parsed = parse_target(target or base_url or "", tls=tls)
        self.target = parsed.address
        self.base_url = parsed.base_url
        self.timeout_s = timeout_s
        self.options = dict(options or {})
        self._stream_batch_size = stream_batch_size
        self._stream_window = stream_window
        self._auth = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._gpu = gpu
        self._pool = pool
        self._metadata = self._routing()
        channel_options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        if parsed.tls:
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            self._channel = grpc.aio.secure_channel(self.target, credentials, options=channel_options)
        else:
            self._channel = grpc.aio.insecure_channel(self.target, options=channel_options)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._renewals: dict[str, asyncio.Task[None]] = {}

    def _routing(self, gpu: str | None = None, pool: str | None = None) -> tuple[tuple[str, str], ...]:
        """Call metadata: credentials, and the machine profile and pool (the call's, else the client's)."""
        headers = ((MACHINE_PROFILE_HEADER, gpu or self._gpu), (POOL_HEADER, pool or self._pool))
        return self._auth + tuple((key, value) for key, value in headers if value)

    async def __aenter__(self) -> AsyncSIEClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop renewing pools (they then expire by themselves) and close the channel."""
        for name in list(self._renewals):
            self._stop_renewing(name)
        await self._channel.close()

    @overload  # a str is also a Sequence: one str is one item, as the first overload says
    async def encode(self, model: str, items: ItemLike, **options: Unpack[EncodeOptions]) -> EncodeResult: ...  # type: ignore[overload-overlap]
    @overload
    async def encode(
        self, model: str, items: Sequence[ItemLike], **options: Unpack[EncodeOptions]
    ) -> list[EncodeResult]: ...

    async def encode(
        self,
        model: str,
        items: ItemLike | Sequence[ItemLike],
        *,
        output_types: Sequence[str] | None = None,
        output_dtype: str | None = None,
        instruction: str | None = None,
        is_query: bool = False,
        dims: int | None = None,
        profile: str | None = None,
        lora: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        pool: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float = 300.0,
        max_oom_retries: int = 3,
        progress: bool = False,
        debug: bool = False,
    ) -> EncodeResult | list[EncodeResult]:
        """Embeddings: one item in, one result out; a list in, a list out, in order.

        A result is a dict: `dense` (numpy, zero-copy), `sparse` ({indices, values}),
        `multivector` (2-D numpy), `timing`. Long lists are pipelined over EncodeStream.
        `debug` adds the statistics of the request's batches as `timing["batches"]`.
        `gpu` / `pool` route this call (machine profile, resource pool) instead of the client's.
        """
        single, batch = is_single(items), as_batch(items)
        policy = RetryPolicy(
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        if not batch:
            return []  # a list in, a list out: no request (the server refuses one without items)
        chunks = [
            messages.encode_request(
                model,
                batch[start : start + self._stream_batch_size],
                output_types=output_types,
                output_dtype=output_dtype,
                instruction=instruction,
                is_query=is_query,
                dims=dims,
                profile=profile,
                lora=lora,
                options={**self.options, **(options or {})},
                debug=debug,
            )
            for start in range(0, len(batch), self._stream_batch_size)
        ]
        metadata = self._routing(gpu, pool)
        if len(chunks) == 1:
            responses = [await self._call(self._stub.Encode, chunks[0], policy, metadata)]
        else:
            responses = await self._encode_streamed(chunks, policy, progress, metadata)
        results = [result for response in responses for result in messages.encode_results(response)]
        return results[0] if single else results

    async def score(
        self,
        model: str,
        query: ItemLike,
        items: Sequence[ItemLike],
        *,
        top_k: int | None = None,
        instruction: str | None = None,
        profile: str | None = None,
        lora: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        pool: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float = 300.0,
        max_oom_retries: int = 3,
        debug: bool = False,
    ) -> ScoreResult:
        """Relevance of each item to `query`, best first: {model, query_id, scores: [{item_id, index, score, rank}],
        timing}."""
        merged = {**self.options, **(options or {})}
        query_message = messages.item_message(query)
        request = inference_pb2.ScoreRequest(
            model=model,
            query=query_message,
            items=[messages.item_message(item) for item in items],
            profile=profile or "",
            lora=lora or "",
            debug=debug,
        )
        if top_k is not None:
            request.top_k = top_k
        if instruction is not None:
            request.instruction = instruction
        if (struct := messages.options_struct(merged)) is not None:
            request.options.CopyFrom(struct)
        policy = RetryPolicy(
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        response = await self._call(self._stub.Score, request, policy, self._routing(gpu, pool))
        return messages.score_result(response, query_message.id or None)

    @overload  # a str is also a Sequence: one str is one item, as the first overload says
    async def extract(self, model: str, items: ItemLike, **options: Unpack[ExtractOptions]) -> ExtractResult: ...  # type: ignore[overload-overlap]
    @overload
    async def extract(
        self, model: str, items: Sequence[ItemLike], **options: Unpack[ExtractOptions]
    ) -> list[ExtractResult]: ...

    async def extract(
        self,
        model: str,
        items: ItemLike | Sequence[ItemLike],
        *,
        labels: Sequence[str] | None = None,
        threshold: float | None = None,
        profile: str | None = None,
        lora: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        pool: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float = 300.0,
        max_oom_retries: int = 3,
        debug: bool = False,
    ) -> ExtractResult | list[ExtractResult]:
        """Per item: {id, entities: [{text, label, score, start, end}], classifications: [{label, score}],
        relations: [{head, tail, label, score}] (head and tail are entities), objects: [{label, score, bbox}]
        (bbox [x_min, y_min, x_max, y_max] in pixels of the original image), data (what a document model generated:
        {"text": ...} or a JSON object; {} for other models), timing}. Each model fills the kinds it produces; the
        others are empty. Items may be texts or images, as the model's inputs say."""
        single, batch = is_single(items), as_batch(items)
        if not batch:
            return []
        merged = {**self.options, **(options or {})}
        shared = inference_pb2.ExtractRequest(
            model=model, labels=list(labels or ()), profile=profile or "", lora=lora or "", debug=debug
        )
        if threshold is not None:
            shared.threshold = threshold
        if (struct := messages.options_struct(merged)) is not None:
            shared.options.CopyFrom(struct)
        policy = RetryPolicy(
            wait_for_capacity=wait_for_capacity,
            provision_timeout_s=provision_timeout_s,
            max_oom_retries=max_oom_retries,
        )
        metadata = self._routing(gpu, pool)
        window = asyncio.Semaphore(self._stream_window)

        async def extract_chunk(chunk: Sequence[types_pb2.Item]) -> list[ExtractResult]:
            request = inference_pb2.ExtractRequest()
            request.CopyFrom(shared)
            request.items.extend(chunk)
            async with window:
                return messages.extract_results(await self._call(self._stub.Extract, request, policy, metadata))

        # Lists longer than stream_batch_size go as several requests (as encode's do), stream_window at a time.
        items_sent = [messages.item_message(item) for item in batch]  # every item checked before any is sent
        size = self._stream_batch_size
        tasks = [
            asyncio.ensure_future(extract_chunk(items_sent[start : start + size]))
            for start in range(0, len(items_sent), size)
        ]
        try:
            parts = await asyncio.gather(*tasks)
        except BaseException:  # the first failure is the call's; the other chunks are not left running
            for task in tasks:
                task.cancel()
            raise
        results = [result for part in parts for result in part]
        return results[0] if single else results

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

    async def _call(
        self,
        method: Callable[..., Awaitable[Response]],
        request: Any,
        policy: RetryPolicy,
        metadata: tuple[tuple[str, str], ...] | None = None,
    ) -> Response:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await method(
                    request, metadata=self._metadata if metadata is None else metadata, timeout=self.timeout_s
                )
            except grpc.aio.AioRpcError as error:
                status = call_status(error)
            await asyncio.sleep(self._delay_or_raise(status, policy, attempt, started))

    @staticmethod
    def _delay_or_raise(status: CallStatus, policy: RetryPolicy, attempt: int, started: float) -> float:
        waited = time.monotonic() - started
        delay = policy.delay(status, attempt, waited)
        if delay is not None:
            return delay
        if policy.wait_for_capacity and status.reason in CAPACITY_REASONS:
            raise ProvisioningTimeoutError(
                f"no capacity after {waited:.1f} s (provision_timeout_s={policy.provision_timeout_s}): "
                f"{status.message}",
                code=status.code,
                reason=status.reason,
                metadata=status.metadata,
            )
        raise status.error()

    async def _encode_streamed(
        self,
        requests: list[inference_pb2.EncodeRequest],
        policy: RetryPolicy,
        progress: bool,
        metadata: tuple[tuple[str, str], ...],
    ) -> list[inference_pb2.EncodeResponse]:
        """Send the requests over one EncodeStream, `stream_window` in flight, and return the answers in order."""
        outgoing: asyncio.Queue[inference_pb2.EncodeRequest | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._stream_window)
        answers: list[inference_pb2.EncodeResponse | None] = [None] * len(requests)
        attempts = [0] * len(requests)
        started = time.monotonic()
        bar = _progress_bar(sum(len(r.items) for r in requests)) if progress else None
        loop = asyncio.get_running_loop()

        async def stream_requests() -> AsyncIterator[inference_pb2.EncodeStreamRequest]:
            while (request := await outgoing.get()) is not None:
                yield inference_pb2.EncodeStreamRequest(request=request)

        async def feed() -> None:
            for index, request in enumerate(requests):
                await slots.acquire()
                request.request_id = str(index)
                outgoing.put_nowait(request)

        call = self._stub.EncodeStream(stream_requests(), metadata=metadata)
        feeder = asyncio.create_task(feed())
        remaining = len(requests)
        # The stream has no deadline (a long list takes as long as it takes), but each answer does: `timeout_s`
        # after the previous one, or after the last retry is due; a server that stops answering is not waited on for
        # ever.
        retries_due = loop.time()
        try:
            while True:
                wait_s = self.timeout_s + max(0.0, retries_due - loop.time())
                try:
                    answer = await asyncio.wait_for(call.read(), wait_s)
                except TimeoutError:
                    raise ServerError(
                        f"EncodeStream: no answer in {wait_s:.1f} s (timeout_s={self.timeout_s}) with {remaining} "
                        f"requests outstanding",
                        code=grpc.StatusCode.DEADLINE_EXCEEDED,
                    ) from None
                if answer is grpc.aio.EOF:
                    break
                index = int(answer.request_id)
                if answer.WhichOneof("outcome") == "error":
                    attempts[index] += 1
                    status = status_from_proto(answer.error)
                    delay = self._delay_or_raise(status, policy, attempts[index], started)
                    loop.call_later(delay, outgoing.put_nowait, requests[index])
                    retries_due = max(retries_due, loop.time() + delay)
                    continue
                answers[index] = answer.response
                slots.release()
                remaining -= 1
                if bar is not None:
                    bar.update(len(answer.response.results))
                if remaining == 0:
                    outgoing.put_nowait(None)
        except grpc.aio.AioRpcError as error:
            raise call_status(error).error() from None
        finally:
            feeder.cancel()
            call.cancel()
            if bar is not None:
                bar.close()
        return [answer for answer in answers if answer is not None]


def _check_wait(timeout_s: float, poll_s: float) -> None:
    """A wait that ends: NaN never compares past a deadline, and polling without a pause floods the server."""
    if not timeout_s >= 0:
        raise ValueError(f"timeout_s must be a number of seconds >= 0, not {timeout_s}")
    if not 0 < poll_s < math.inf:
        raise ValueError(f"poll_s must be a positive, finite number of seconds, not {poll_s}")


def _capacity_timeout(message: str) -> ProvisioningTimeoutError:
    return ProvisioningTimeoutError(message, code=grpc.StatusCode.DEADLINE_EXCEEDED)


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="item", desc="encode")
