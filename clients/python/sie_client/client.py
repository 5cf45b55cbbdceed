"""AsyncSIEClient: the engine's three verbs, model listing and pools over grpc.aio.

Works against a gateway and a standalone worker alike. Retries follow
RetryPolicy: capacity waits (PROVISIONING, MODEL_LOADING) honour the server's
RetryInfo delay until `provision_timeout_s`; LORA_LOADING a bounded number of
times; RESOURCE_EXHAUSTED with capped backoff; request errors never.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar, overload

import grpc

from sie.v1 import inference_pb2, inference_pb2_grpc
from sie_client import messages
from sie_client.errors import ProvisioningTimeoutError
from sie_client.messages import ItemLike
from sie_client.retry import CAPACITY_REASONS, RetryPolicy
from sie_client.status import CallStatus, call_status, status_from_proto
from sie_client.types import EncodeResult, ExtractResult, ScoreResult

Response = TypeVar("Response")

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class AsyncSIEClient:
    def __init__(
        self,
        target: str,
        *,
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
        """`target` is host:port. `gpu` picks a machine profile and `pool` a resource pool on a
        gateway; `options` are defaults merged under each call's own. Lists longer than
        `stream_batch_size` are sent as several requests, `stream_window` at a time, on one stream.
        TLS is on with `tls=True` or any of the PEM arguments: `root_certificates` to trust
        (default: the system's), `certificate_chain` and `private_key` for mutual TLS."""
        self.target = target
        self.timeout_s = timeout_s
        self.options = dict(options or {})
        self._stream_batch_size = stream_batch_size
        self._stream_window = stream_window
        self._metadata = tuple(
            (key, value)
            for key, value in (
                ("authorization", f"Bearer {api_key}" if api_key else None),
                ("x-sie-machine-profile", gpu),
                ("x-sie-pool", pool),
            )
            if value
        )
        channel_options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
        if tls or root_certificates or certificate_chain or private_key:
            credentials = grpc.ssl_channel_credentials(root_certificates, private_key, certificate_chain)
            self._channel = grpc.aio.secure_channel(target, credentials, options=channel_options)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=channel_options)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)
        self._renewals: dict[str, asyncio.Task[None]] = {}

    async def __aenter__(self) -> AsyncSIEClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop renewing pools (they then expire by themselves) and close the channel."""
        for name in list(self._renewals):
            self._stop_renewing(name)
        await self._channel.close()

    @overload
    async def encode(self, model: str, items: ItemLike, **kwargs: Any) -> EncodeResult: ...
    @overload
    async def encode(self, model: str, items: Sequence[ItemLike], **kwargs: Any) -> list[EncodeResult]: ...

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
        wait_for_capacity: bool = True,
        provision_timeout_s: float = 300.0,
        progress: bool = False,
        debug: bool = False,
    ) -> EncodeResult | list[EncodeResult]:
        """Embeddings: one item in, one result out; a list in, a list out, in order.

        A result is a dict: `dense` (numpy, zero-copy), `sparse` ({indices, values}),
        `multivector` (2-D numpy), `timing`. Long lists are pipelined over EncodeStream.
        `debug` adds the statistics of the request's batches as `timing["batches"]`.
        """
        single = isinstance(items, (str, messages.Item))
        batch: Sequence[ItemLike] = [items] if single else items  # type: ignore[list-item]
        policy = RetryPolicy(wait_for_capacity=wait_for_capacity, provision_timeout_s=provision_timeout_s)
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
            for start in range(0, max(len(batch), 1), self._stream_batch_size)
        ]
        if len(chunks) == 1:
            responses = [await self._call(self._stub.Encode, chunks[0], policy)]
        else:
            responses = await self._encode_streamed(chunks, policy, progress)
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
        wait_for_capacity: bool = True,
        provision_timeout_s: float = 300.0,
        debug: bool = False,
    ) -> ScoreResult:
        """Relevance of each item to `query`, best first: {model, scores: [{item_id, index, score, rank}], timing}."""
        merged = {**self.options, **(options or {})}
        request = inference_pb2.ScoreRequest(
            model=model,
            query=messages.item_message(query),
            items=[messages.item_message(item) for item in items],
            profile=profile or "",
            lora=messages.lora_of(merged, lora),
            debug=debug,
        )
        if top_k is not None:
            request.top_k = top_k
        if instruction is not None:
            request.instruction = instruction
        if (struct := messages.options_struct(merged)) is not None:
            request.options.CopyFrom(struct)
        policy = RetryPolicy(wait_for_capacity=wait_for_capacity, provision_timeout_s=provision_timeout_s)
        return messages.score_result(await self._call(self._stub.Score, request, policy))

    @overload
    async def extract(self, model: str, items: ItemLike, **kwargs: Any) -> ExtractResult: ...
    @overload
    async def extract(self, model: str, items: Sequence[ItemLike], **kwargs: Any) -> list[ExtractResult]: ...

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
        wait_for_capacity: bool = True,
        provision_timeout_s: float = 300.0,
        debug: bool = False,
    ) -> ExtractResult | list[ExtractResult]:
        """Entities per item: {id, entities: [{text, label, score, start, end}], timing}."""
        single = isinstance(items, (str, messages.Item))
        batch: Sequence[ItemLike] = [items] if single else items  # type: ignore[list-item]
        merged = {**self.options, **(options or {})}
        request = inference_pb2.ExtractRequest(
            model=model,
            items=[messages.item_message(item) for item in batch],
            labels=list(labels or ()),
            profile=profile or "",
            lora=messages.lora_of(merged, lora),
            debug=debug,
        )
        if threshold is not None:
            request.threshold = threshold
        if (struct := messages.options_struct(merged)) is not None:
            request.options.CopyFrom(struct)
        policy = RetryPolicy(wait_for_capacity=wait_for_capacity, provision_timeout_s=provision_timeout_s)
        results = messages.extract_results(await self._call(self._stub.Extract, request, policy))
        return results[0] if single else results

    async def list_models(self) -> list[dict[str, Any]]:
        response = await self._call(self._stub.ListModels, inference_pb2.ListModelsRequest(), RetryPolicy())
        return [messages.as_dict(model) for model in response.models]

    async def get_model(self, model: str) -> dict[str, Any]:
        response = await self._call(self._stub.GetModel, inference_pb2.GetModelRequest(model=model), RetryPolicy())
        return messages.as_dict(response.model)

    async def create_pool(self, name: str, gpus: Mapping[str, int], *, ttl_s: int = 60) -> dict[str, Any]:
        """Reserve workers (machine profile -> count) for this client's `pool` requests.

        The lease is renewed in the background every third of `ttl_s` until
        `delete_pool` or `close`; after that the pool expires by itself."""
        request = inference_pb2.CreatePoolRequest(name=name, gpus=dict(gpus), ttl_s=ttl_s)
        response = await self._call(self._stub.CreatePool, request, RetryPolicy())
        self._stop_renewing(name)
        self._renewals[name] = asyncio.create_task(self._renew(name, max(ttl_s / 3, 0.2)))
        return messages.as_dict(response.pool)

    async def get_pool(self, name: str) -> dict[str, Any]:
        response = await self._call(self._stub.GetPool, inference_pb2.GetPoolRequest(name=name), RetryPolicy())
        return messages.as_dict(response.pool)

    async def delete_pool(self, name: str) -> None:
        self._stop_renewing(name)
        await self._call(self._stub.DeletePool, inference_pb2.DeletePoolRequest(name=name), RetryPolicy())

    async def _renew(self, name: str, every_s: float) -> None:
        while True:
            await asyncio.sleep(every_s)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self._stub.RenewPool(inference_pb2.RenewPoolRequest(name=name), metadata=self._metadata, timeout=self.timeout_s)

    def _stop_renewing(self, name: str) -> None:
        task = self._renewals.pop(name, None)
        if task is not None:
            task.cancel()

    async def _call(self, method: Callable[..., Awaitable[Response]], request: Any, policy: RetryPolicy) -> Response:
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                return await method(request, metadata=self._metadata, timeout=self.timeout_s)
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
                f"no capacity after {waited:.1f} s (provision_timeout_s={policy.provision_timeout_s}): {status.message}",
                code=status.code,
                reason=status.reason,
                metadata=status.metadata,
            )
        raise status.error()

    async def _encode_streamed(
        self, requests: list[inference_pb2.EncodeRequest], policy: RetryPolicy, progress: bool
    ) -> list[inference_pb2.EncodeResponse]:
        """Send the requests over one EncodeStream, `stream_window` in flight, and return the answers in order."""
        outgoing: asyncio.Queue[inference_pb2.EncodeRequest | None] = asyncio.Queue()
        slots = asyncio.Semaphore(self._stream_window)
        answers: list[inference_pb2.EncodeResponse | None] = [None] * len(requests)
        attempts = [0] * len(requests)
        started = time.monotonic()
        bar = _progress_bar(sum(len(r.items) for r in requests)) if progress else None
        loop = asyncio.get_running_loop()

        async def stream_requests():
            while (request := await outgoing.get()) is not None:
                yield inference_pb2.EncodeStreamRequest(request=request)

        async def feed() -> None:
            for index, request in enumerate(requests):
                await slots.acquire()
                request.request_id = str(index)
                outgoing.put_nowait(request)

        call = self._stub.EncodeStream(stream_requests(), metadata=self._metadata)
        feeder = asyncio.create_task(feed())
        remaining = len(requests)
        try:
            async for answer in call:
                index = int(answer.request_id)
                if answer.WhichOneof("outcome") == "error":
                    attempts[index] += 1
                    status = status_from_proto(answer.error)
                    delay = self._delay_or_raise(status, policy, attempts[index], started)
                    loop.call_later(delay, outgoing.put_nowait, requests[index])
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


def _progress_bar(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="item", desc="encode")
