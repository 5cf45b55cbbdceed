"""The engine's three verbs: encode, score and extract, with the reference SDK's arguments and ours."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack, overload

from sie.v1 import inference_pb2, types_pb2
from sie_client import messages
from sie_client.errors import IncompleteBatchError, NotSupportedError
from sie_client.messages import ItemLike, as_batch, is_single
from sie_client.pools import PoolMethods
from sie_client.progress import Progress
from sie_client.retry import Metadata, RetryPolicy
from sie_client.streaming import encode_streamed, in_windows
from sie_client.types import EncodeResult, ExtractResult, ScoreResult


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
    provision_timeout_s: float | None
    max_oom_retries: int
    debug: bool


class EncodeOptions(_CallOptions, total=False):
    output_types: Sequence[str] | None
    output_dtype: str | None
    instruction: str | None
    is_query: bool | None
    dims: int | None
    progress: bool


class ExtractOptions(_CallOptions, total=False):
    labels: Sequence[str] | None
    output_schema: Mapping[str, Any] | None
    instruction: str | None
    threshold: float | None
    progress: bool


# How long a call waits for capacity (scale from zero, a model loading) without provision_timeout_s: the reference's.
DEFAULT_PROVISION_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class _CallSettings:
    """What a verb's own arguments make of the client's defaults: the model and profile (from "model@profile" or
    profile=), the options sent, the retries and the routing."""

    model: str
    profile: str
    options: dict[str, Any]
    policy: RetryPolicy
    metadata: Metadata


def model_and_profile(model: str, profile: str | None) -> tuple[str, str]:
    """ "model@profile" (the reference's way to name a profile) as (model, profile); a `profile=` that names another
    profile is a ValueError."""
    named, at, suffix = model.rpartition("@")
    if not at:
        return model, profile or ""
    if profile and profile != suffix:
        raise ValueError(f"{model!r} names profile {suffix!r}, profile= names {profile!r}: give one")
    return named, suffix


class VerbMethods(PoolMethods):
    async def _settings(
        self,
        model: str,
        profile: str | None,
        options: Mapping[str, Any] | None,
        gpu: str | None,
        pool: str | None,
        wait_for_capacity: bool,
        provision_timeout_s: float | None,
        max_oom_retries: int,
    ) -> _CallSettings:
        """Checked before anything is sent; a pool given as a spec at construction is created first."""
        model, profile = model_and_profile(model, profile)
        settings = _CallSettings(
            model=model,
            profile=profile,
            options={**self.options, **(options or {})},
            policy=RetryPolicy(
                wait_for_capacity=wait_for_capacity,
                provision_timeout_s=DEFAULT_PROVISION_TIMEOUT_S if provision_timeout_s is None else provision_timeout_s,
                max_oom_retries=max_oom_retries,
            ),
            metadata=self._routing(gpu, pool),
        )
        await self._ensure_pool()
        return settings

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
        is_query: bool | None = None,
        dims: int | None = None,
        profile: str | None = None,
        lora: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        pool: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
        progress: bool = False,
        debug: bool = False,
    ) -> EncodeResult | list[EncodeResult]:
        """Embeddings: one item in, one result out; a list in, a list out, in order.

        A result is a dict: `model`, `id`, `dense` (numpy, zero-copy), `sparse` ({indices, values}),
        `multivector` (2-D numpy), `timing`. Long lists are pipelined over EncodeStream.
        `debug` adds the statistics of the request's batches as `timing["batches"]`.
        `gpu` / `pool` route this call (machine profile, resource pool) instead of the client's.
        `progress` shows a tqdm bar of the items answered (the client's `progress` extra).
        """
        single, batch = is_single(items), as_batch(items)
        call = await self._settings(
            model, profile, options, gpu, pool, wait_for_capacity, provision_timeout_s, max_oom_retries
        )
        if not batch:
            return []  # a list in, a list out: no request (the server refuses one without items)
        bar = Progress(progress, len(batch), "encode")
        chunks = [
            messages.encode_request(
                call.model,
                batch[start : start + self._stream_batch_size],
                output_types=output_types,
                output_dtype=output_dtype,
                instruction=instruction,
                is_query=bool(is_query),
                dims=dims,
                profile=call.profile,
                lora=lora,
                options=call.options,
                debug=debug,
            )
            for start in range(0, len(batch), self._stream_batch_size)
        ]
        try:
            if len(chunks) == 1:
                responses = [await self._call(self._stub.Encode, chunks[0], call.policy, call.metadata)]
                bar.advance(len(batch))
            else:
                async with self._in_flight():
                    await self._connected()
                    responses = await encode_streamed(
                        self._stub,
                        chunks,
                        call.policy,
                        window=self._stream_window,
                        site=self._site(inference_pb2.EncodeStreamRequest()),
                        progress=bar,
                        metadata=call.metadata,
                    )
        finally:
            bar.close()
        size = self._stream_batch_size
        results = [
            result
            for number, response in enumerate(responses)
            for result in messages.encode_results(response, first_index=number * size)
        ]
        _check_count(results, len(batch), call.model, "encode")
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
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
        progress: bool = False,
        debug: bool = False,
    ) -> ScoreResult:
        """Relevance of each item to `query`, best first: {model, query_id, scores: [{item_id, index, score, rank}],
        timing}. The items go in one request; `progress` shows a bar that completes with its answer."""
        call = await self._settings(
            model, profile, options, gpu, pool, wait_for_capacity, provision_timeout_s, max_oom_retries
        )
        query_message = messages.item_message(query, "score's query")
        if messages.is_single(items):
            raise TypeError(f"score's items are a list of items, not one {type(items).__name__}: wrap it in [...]")
        request = inference_pb2.ScoreRequest(
            model=call.model,
            query=query_message,
            items=[messages.item_message(item, f"score's items[{index}]") for index, item in enumerate(items)],
            profile=call.profile,
            lora=lora or "",
            debug=debug,
        )
        if top_k is not None:
            request.top_k = top_k
        if instruction is not None:
            request.instruction = instruction
        if (struct := messages.options_struct(call.options)) is not None:
            request.options.CopyFrom(struct)
        bar = Progress(progress, len(request.items), "score")
        try:
            response = await self._call(self._stub.Score, request, call.policy, call.metadata)
            bar.advance(len(request.items))
        finally:
            bar.close()
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
        output_schema: Mapping[str, Any] | None = None,
        instruction: str | None = None,
        threshold: float | None = None,
        profile: str | None = None,
        lora: str | None = None,
        options: Mapping[str, Any] | None = None,
        gpu: str | None = None,
        pool: str | None = None,
        wait_for_capacity: bool = True,
        provision_timeout_s: float | None = None,
        max_oom_retries: int = 3,
        progress: bool = False,
        debug: bool = False,
    ) -> ExtractResult | list[ExtractResult]:
        """Per item: {model, id, entities: [{text, label, score, start, end}], classifications: [{label, score}],
        relations: [{head, tail, relation, score}] (the entities' texts; head_entity and tail_entity with offsets),
        objects: [{label, score, bbox}] (bbox [x, y, width, height] in pixels of the original image; box the exact
        corners), data (what a document model generated: {"text": ...} or a JSON object; {} for other models),
        timing}. Each model fills the kinds it produces; the others are empty. Items may be texts or images, as the
        model's inputs say. `progress` shows a bar of the items answered. The reference's `output_schema` and
        `instruction` (schema-driven extraction) are a NotSupportedError: this engine's extractors take labels."""
        for name, value in (("output_schema", output_schema), ("instruction", instruction)):
            if value is not None:
                raise NotSupportedError(f"extract({name}=...): this engine's extractors take labels= and threshold=")
        single, batch = is_single(items), as_batch(items)
        if not batch:
            return []
        call = await self._settings(
            model, profile, options, gpu, pool, wait_for_capacity, provision_timeout_s, max_oom_retries
        )
        shared = inference_pb2.ExtractRequest(
            model=call.model, labels=list(labels or ()), profile=call.profile, lora=lora or "", debug=debug
        )
        if threshold is not None:
            shared.threshold = threshold
        if (struct := messages.options_struct(call.options)) is not None:
            shared.options.CopyFrom(struct)

        async def extract_chunk(start: int, chunk: Sequence[types_pb2.Item]) -> list[ExtractResult]:
            request = inference_pb2.ExtractRequest()
            request.CopyFrom(shared)
            request.items.extend(chunk)
            response = await self._call(self._stub.Extract, request, call.policy, call.metadata)
            bar.advance(len(chunk))
            return messages.extract_results(response, first_index=start)

        # Lists longer than stream_batch_size go as several requests (as encode's do), stream_window at a time.
        items_sent = [messages.item_message(item) for item in batch]  # every item checked before any is sent
        size = self._stream_batch_size
        bar = Progress(progress, len(items_sent), "extract")
        chunks = [extract_chunk(start, items_sent[start : start + size]) for start in range(0, len(items_sent), size)]
        try:
            parts = await in_windows(chunks, self._stream_window)
        finally:
            bar.close()
        results = [result for part in parts for result in part]
        _check_count(results, len(batch), call.model, "extract")
        return results[0] if single else results


def _check_count(results: Sequence[Any], expected: int, model: str, verb: str) -> None:
    """One result per item, or IncompleteBatchError (as the reference raises): never results paired with the wrong
    items."""
    if len(results) != expected:
        raise IncompleteBatchError(
            f"{verb} of {model!r}: the server answered {len(results)} results for {expected} items",
            code=f"{verb.upper()}_RESULT_COUNT_MISMATCH",
            expected=expected,
            received=len(results),
            model=model,
            results=results,
        )
