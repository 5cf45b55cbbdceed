"""The pipeline of one worker, for encode, score and extract.

    admission -> plan (sie_worker.engine.plan: the model and what the request computes, checked once)
              -> tokenize (CPU pool) / decode and preprocess images (image pool)
              -> BatchFormer -> device thread -> postprocess (CPU pool)

While one batch runs on the device the next is formed and queued behind it,
so the device goes from one forward pass to the next without waiting on the
event loop; until it starts, a batch led by a request that came after it was
formed takes its place (fair queuing, sie_worker.batching.former). Each loaded
model's batch policy (sie_worker.batching.adaptive, made when the model first
batches) sets the wait and token budget its batches are formed under.

Items of concurrent requests share forward passes when their BatchKey
(sie_worker.engine.batch_key) matches: model, profile, operation, LoRA,
run-time options (as canonical JSON), modality, output types, instruction,
is_query, and an extract's labels and threshold; image items have keys of
their own (modality "image"). Each caller gets its own items back in its own
order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numpy as np

from sie_common.edge.answer_size import MAX_SEND_SETTING, check_dense_estimate
from sie_common.edge.errors import (
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    SieError,
    Unavailable,
)
from sie_common.runtime.tracing import record_span, recording, span
from sie_worker.adapters.base import (
    Continued,
    EncodedItem,
    ExtractInput,
    ExtractQuery,
    ImageEncoder,
    ImageExtractor,
    ItemExtractor,
    MultivectorCounter,
    PairScorer,
    PatchImageEncoder,
    Prepared,
    TextEncoder,
    TokenizedText,
)
from sie_worker.batching.adaptive import BatchPolicy, batching_for
from sie_worker.batching.former import Batch, BatchFormer, BatchLimits, PendingItem
from sie_worker.batching.stats import BatchStats, describe, publish_setting, record
from sie_worker.engine.batch_key import BatchKey, canonical_options
from sie_worker.engine.images import check_images_pixels, decode_image
from sie_worker.engine.jobs import (
    EncodedOutput,
    EncodeJob,
    EncodeOutcome,
    ExtractJob,
    ExtractOutcome,
    ItemInput,
    ScoredItem,
    ScoreJob,
    ScoreOutcome,
    Timing,
)
from sie_worker.engine.limits import Limits, check_held_multivectors
from sie_worker.engine.plan import Planner, RequestPlan, Similarity
from sie_worker.engine.postprocess import muvera, quantize, truncate
from sie_worker.metrics import QUEUE_DEPTH, record_batch
from sie_worker.models.batch_retry import blame_item, run_isolating_failures
from sie_worker.models.build import LoadedModel
from sie_worker.models.memory import is_cuda_oom, release_cuda_cache
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

T = TypeVar("T")
# A batch's forward pass: one output per payload, as a list or as the rows of an array (a scorer's scores).
Forward = Callable[[Sequence[Any]], Sequence[Any] | np.ndarray]

# Requests of at most this many items are tokenized, finished and answered on the event loop (see `off_loop`).
INLINE_ITEMS = 8
# ... and of at most this many characters of text: the tokenizer may read a text whole (one long word, or long
# whitespace before its first word), about 0.5 s per 2 MiB text, which must not hold the event loop.
INLINE_TEXT_CHARS = 32 * 1024

# Batches handed to the device thread at once: the one running and the next, formed behind it.
PIPELINE_DEPTH = 2
# Batching cost of one image where the processor gives every image the same size.
IMAGE_COST = 1


@dataclass(frozen=True)
class _DeviceWork:
    """What a batch runs: `forward` over its items' payloads, with one LoRA adapter active, under the model's batch
    policy."""

    model: LoadedModel
    policy: BatchPolicy
    lora: str
    forward: Forward


@dataclass(frozen=True)
class _ItemResult:
    output: Any
    batch: BatchStats
    # Waits for the device, before its batch and (a generation) before each later slice.
    queue_ms: float
    tokens: int
    # A generation's slices before the last (`batch`).
    earlier: tuple[BatchStats, ...] = ()


@dataclass
class _Clock:
    """Where a request's time went."""

    started: float
    # Whether the answer carries the statistics of its batches.
    debug: bool = False
    tokenization_ms: float = 0.0
    postprocessing_ms: float = 0.0

    def timing(self, results: Sequence[_ItemResult]) -> Timing:
        batches = {batch.batch_id: batch for result in results for batch in (*result.earlier, result.batch)}
        return Timing(
            queue_ms=max((result.queue_ms for result in results), default=0.0),
            tokenization_ms=self.tokenization_ms,
            inference_ms=sum(batch.inference_ms for batch in batches.values()),
            postprocessing_ms=self.postprocessing_ms,
            total_ms=_ms_since(self.started),
            batches=tuple(batches[batch_id] for batch_id in sorted(batches)) if self.debug else (),
        )


class Engine:
    """The pipeline around a registry of models (passed in: an engine can be built in-process around any adapters)."""

    def __init__(self, settings: WorkerSettings, registry: ModelRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.device = registry.device
        self.limits = Limits.from_settings(settings)
        self._former = BatchFormer()
        self._cpu_pool = ThreadPoolExecutor(settings.preprocessor_workers, thread_name_prefix="sie-cpu")
        self._image_pool = ThreadPoolExecutor(settings.image_workers, thread_name_prefix="sie-image")
        # One inference thread per device serializes device work (forward passes and LoRA loads).
        self._device_thread = ThreadPoolExecutor(1, thread_name_prefix="sie-device")
        self._background: list[asyncio.Task[None]] = []
        self._planner = Planner(self.registry, self.limits, settings.max_send_message_bytes, self._device_thread)
        # Each loaded model's batch policy, for as long as it stays loaded (a reload starts afresh).
        self._policies: weakref.WeakKeyDictionary[LoadedModel, BatchPolicy] = weakref.WeakKeyDictionary()
        self._in_flight = 0
        self._batches = 0
        self._draining = False

    async def start(self) -> None:
        self._background = [
            asyncio.create_task(self._run_device(), name="sie-device-loop"),
            asyncio.create_task(self.registry.monitor(), name="sie-memory-monitor"),
        ]
        for model_id in self.settings.preload_models:
            try:
                await self.registry.load(model_id)
            except Exception as error:  # noqa: BLE001 - reported in the log and ListModels; the other models still serve
                log.error("preloading %s failed: %s", model_id, error)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests (UNAVAILABLE) and wait for those in flight; False if the deadline passed first."""
        self._draining = True
        deadline = time.monotonic() + timeout_s
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._in_flight == 0

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._cpu_pool.shutdown(wait=False, cancel_futures=True)
        self._image_pool.shutdown(wait=False, cancel_futures=True)
        self._device_thread.shutdown(wait=True)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold one of SIE_MAX_CONCURRENT_REQUESTS slots, or answer RESOURCE_EXHAUSTED."""
        if self._draining:
            raise Unavailable(
                "worker is shutting down; send the request to another worker",
                reason="SHUTTING_DOWN",
                retry_after_s=1.0,
            )
        limit = self.settings.max_concurrent_requests
        if self._in_flight >= limit:
            raise ResourceExhausted(
                f"worker at capacity: {limit} requests in flight (SIE_MAX_CONCURRENT_REQUESTS); retry with backoff",
                reason="QUEUE_FULL",
                metadata={"limit": str(limit)},
            )
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1

    def _clock(self, debug: bool) -> _Clock:
        """A request's clock; `debug` (batch statistics in the answer) needs SIE_INSTRUMENTATION."""
        if debug and not self.settings.instrumentation:
            raise FailedPrecondition(
                f"debug: per-batch statistics are off on worker {self.settings.worker_id}; start it with "
                f"SIE_INSTRUMENTATION=true",
                reason="INSTRUMENTATION_OFF",
            )
        return _Clock(time.perf_counter(), debug=debug)

    # -- encode ---------------------------------------------------------------

    async def encode(self, job: EncodeJob) -> EncodeOutcome:
        clock = self._clock(job.debug)
        with self.admitted(), contextlib.ExitStack() as holds:
            plan = self._planner.plan(job, holds)
            model = plan.model
            encoded, results = await self._encode_items(
                model,
                job.items,
                plan.device_outputs,
                clock,
                is_query=job.is_query,
                instruction=job.instruction,
                lora=job.lora,
                options=job.options,
                check_rows=self._multivector_budget(plan),
            )

            outputs = await self._postprocess(
                lambda: [_finish(item, plan, is_query=job.is_query) for item in encoded], clock, len(encoded)
            )
            self._count(model, len(job.items))
        return EncodeOutcome(
            model=job.model, items=outputs, timing=clock.timing(results), tokens=sum(r.tokens for r in results)
        )

    def _multivector_budget(self, plan: RequestPlan) -> Callable[[int], None]:
        """Before the forward pass, for the encoders that count their rows ahead (MultivectorCounter): given the rows
        of each part of the request (its texts once tokenized, its images once processed), RESPONSE_TOO_LARGE when
        the plan's multivectors so far could not be sent, and INVALID_ARGUMENT when those it computes (for MUVERA
        too) would be more than SIE_MAX_SCORE_MULTIVECTOR_BYTES to hold (an answer may be far smaller than that:
        MUVERA, a binary dtype), so no vectors are computed and held for an answer that cannot go out or that a
        request may not hold."""
        encoder = plan.model.adapter
        total = 0

        def check(rows: int) -> None:
            nonlocal total
            if "multivector" not in plan.device_outputs or not isinstance(encoder, MultivectorCounter):
                return
            total += rows
            if "multivector" in plan.outputs:
                check_dense_estimate(
                    total,
                    encoder.multivector_dims,
                    plan.output_dtype,
                    self.settings.max_send_message_bytes,
                    MAX_SEND_SETTING,
                )
            check_held_multivectors(total, encoder.multivector_dims, self.limits, plan.task)

        return check

    async def _encode_items(
        self,
        model: LoadedModel,
        items: Sequence[ItemInput],
        outputs: tuple[str, ...],
        clock: _Clock,
        *,
        is_query: bool,
        instruction: str | None,
        lora: str,
        options: Mapping[str, Any],
        check_rows: Callable[[int], None] | None = None,
    ) -> tuple[list[EncodedItem], list[_ItemResult]]:
        """Text items through the text path, image items through the image path (batched apart), back in item order.
        `check_rows` sees the multivector rows of the texts and of the images, where the encoder counts them, before
        they are queued for the device (it raises to refuse them)."""
        encode_texts = functools.partial(
            self._encode_texts,
            is_query=is_query,
            instruction=instruction,
            lora=lora,
            options=options,
            check_rows=check_rows,
        )
        image_rows = [row for row, item in enumerate(items) if item.images]
        if not image_rows:
            return await encode_texts(model, [item.text or "" for item in items], outputs, clock)
        text_rows = [row for row, item in enumerate(items) if not item.images]
        (texts, text_results), (images, image_results) = await _all_or_none(
            encode_texts(model, [items[row].text or "" for row in text_rows], outputs, clock),
            self._encode_images(
                model,
                [items[row] for row in image_rows],
                outputs,
                clock,
                lora=lora,
                options=options,
                check_rows=check_rows,
            ),
        )
        by_row = dict(zip([*text_rows, *image_rows], [*texts, *images], strict=True))
        return [by_row[row] for row in range(len(items))], text_results + image_results

    async def _encode_images(
        self,
        model: LoadedModel,
        items: Sequence[ItemInput],
        outputs: tuple[str, ...],
        clock: _Clock,
        *,
        lora: str,
        options: Mapping[str, Any],
        check_rows: Callable[[int], None] | None = None,
    ) -> tuple[list[EncodedItem], list[_ItemResult]]:
        """One image per item: decoded and preprocessed on the image pool, then batched by the image key, at cost 1
        (every image is processed to one size) or, where images yield a multivector per patch, at their rows."""
        encoder = model.adapter
        assert isinstance(encoder, ImageEncoder)  # check_adapter_serves: a model whose inputs include image has one
        pixels = await self._prepare_images(clock, encoder, items)
        costs = [IMAGE_COST] * len(pixels)
        if isinstance(encoder, PatchImageEncoder):
            costs = [encoder.image_rows(image) for image in pixels]
            if check_rows is not None:
                check_rows(sum(costs))
        key = BatchKey(
            model.config.id,
            model.profile,
            "encode",
            lora,
            canonical_options(options),
            modality="image",
            outputs=outputs,
        )
        work = self._work(model, lora, lambda batch: encoder.encode_images(batch, outputs))
        results = await self._run_on_device(work, key, pixels, costs)
        return [result.output for result in results], results

    async def _prepare_images(self, clock: _Clock, encoder: ImageEncoder, items: Sequence[ItemInput]) -> list[Any]:
        """Decode (within the image limits, checked on the header) and preprocess each item's image, in parallel on
        the image pool.

        The first bad image in item order is the one reported."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        check = functools.partial(check_images_pixels, limits=self.limits, resized_pixels=encoder.resized_pixels)
        await loop.run_in_executor(self._image_pool, check, items)

        def prepare(item: ItemInput) -> Any:
            return encoder.prepare_image(
                decode_image(item, 0, limits=self.limits, resized_pixels=encoder.resized_pixels)
            )

        prepared = await asyncio.gather(
            *(loop.run_in_executor(self._image_pool, prepare, item) for item in items), return_exceptions=True
        )
        clock.tokenization_ms += _ms_since(started)
        for outcome in prepared:
            if isinstance(outcome, BaseException):
                raise outcome
        return prepared

    async def _encode_texts(
        self,
        model: LoadedModel,
        texts: Sequence[str],
        outputs: tuple[str, ...],
        clock: _Clock,
        *,
        is_query: bool,
        instruction: str | None,
        lora: str,
        options: Mapping[str, Any],
        check_rows: Callable[[int], None] | None = None,
    ) -> tuple[list[EncodedItem], list[_ItemResult]]:
        encoder = cast(TextEncoder, model.adapter)  # the plan checked it encodes
        prompt = encoder.prompt(is_query=is_query, instruction=instruction)
        tokenized = await self._tokenize(
            clock,
            lambda: encoder.tokenize(texts, prompt, is_query=is_query),
            len(texts),
            sum(map(len, texts)) + len(prompt) * len(texts),
        )
        if check_rows is not None and isinstance(encoder, MultivectorCounter):
            check_rows(sum(encoder.multivector_rows(item) for item in tokenized))
        key = BatchKey(
            model.config.id,
            model.profile,
            "encode",
            lora,
            canonical_options(options),
            outputs=outputs,
            instruction=instruction,
            is_query=is_query,
        )
        work = self._work(model, lora, lambda batch: encoder.encode(batch, outputs))
        results = await self._run_on_device(work, key, tokenized, [len(item.ids) for item in tokenized])
        return [result.output for result in results], results

    # -- score ----------------------------------------------------------------

    async def score(self, job: ScoreJob) -> ScoreOutcome:
        clock = self._clock(job.debug)
        with self.admitted(), contextlib.ExitStack() as holds:
            plan = self._planner.plan(job, holds)
            if plan.similarity is None:
                scores, results = await self._score_pairs(plan.model, job, clock)
            else:
                scores, results = await self._score_encoded(plan, job, clock, plan.similarity)
            order = sorted(range(len(scores)), key=lambda index: -scores[index])
            ranked = [ScoredItem(index, float(scores[index])) for index in order[: job.top_k or None]]
            self._count(plan.model, len(job.items))
        return ScoreOutcome(model=job.model, ranked=ranked, timing=clock.timing(results))

    async def _score_pairs(
        self, model: LoadedModel, job: ScoreJob, clock: _Clock
    ) -> tuple[list[float], list[_ItemResult]]:
        scorer = cast(PairScorer, model.adapter)  # the plan checked it scores pairs
        query = job.query.text or ""
        texts = [item.text or "" for item in job.items]
        chars = len(job.instruction or "") + len(query) + sum(map(len, texts))
        tokenized = await self._tokenize(
            clock, lambda: scorer.tokenize_pairs(query, texts, job.instruction), len(texts), chars
        )
        key = BatchKey(
            job.model, model.profile, "score", job.lora, canonical_options(job.options), instruction=job.instruction
        )
        work = self._work(model, job.lora, scorer.score)
        results = await self._run_on_device(work, key, tokenized, [len(item.ids) for item in tokenized])
        return [float(result.output) for result in results], results

    async def _score_encoded(
        self, plan: RequestPlan, job: ScoreJob, clock: _Clock, similarity: Similarity
    ) -> tuple[list[float], list[_ItemResult]]:
        """Encode the query (as a query) and the items with the plan's outputs, then score each item against the query:
        MaxSim of multivectors (late interaction), cosine of dense embeddings (dual encoders, text or image), or
        what the model's options pick (BGE-M3).

        An instruction is the query's (retrieval models encode documents with their document prompt), except on a
        dual encoder, where it is the prompt of every text (`a photo of `), the items included."""
        encoder, outputs = plan.model.adapter, plan.device_outputs
        item_instruction = job.instruction if isinstance(encoder, ImageEncoder) else None
        (query, query_results), (items, item_results) = await _all_or_none(
            self._encode_items(
                plan.model,
                [job.query],
                outputs,
                clock,
                is_query=True,
                instruction=job.instruction,
                lora=job.lora,
                options=job.options,
            ),
            self._encode_items(
                plan.model,
                job.items,
                outputs,
                clock,
                is_query=False,
                instruction=item_instruction,
                lora=job.lora,
                options=job.options,
                check_rows=self._multivector_budget(plan),
            ),
        )
        scores = await self._postprocess(lambda: [similarity(query[0], item) for item in items], clock, len(items))
        return scores, query_results + item_results

    # -- extract --------------------------------------------------------------

    async def extract(self, job: ExtractJob) -> ExtractOutcome:
        """Prepare each item (text on the CPU pool, images decoded on the image pool), run text and image items in
        batches of their own with other requests' items of the same query, then finish each item's results."""
        clock = self._clock(job.debug)
        with self.admitted(), contextlib.ExitStack() as holds:
            model = self._planner.plan(job, holds).model
            extractor = cast(ItemExtractor, model.adapter)  # the plan checked it
            query = ExtractQuery(job.labels, job.threshold, job.options)
            inputs, prepared = await self._prepare_extract(clock, extractor, job.items, query)
            work = self._work(model, job.lora, lambda batch: extractor.run(batch, query))
            options = canonical_options(job.options)

            async def run(rows: list[int], modality: str) -> list[_ItemResult]:
                if not rows:
                    return []
                key = BatchKey(
                    job.model,
                    model.profile,
                    "extract",
                    job.lora,
                    options,
                    labels=job.labels,
                    threshold=job.threshold,
                    modality=modality,
                )
                return await self._run_on_device(
                    work, key, [prepared[row].value for row in rows], [prepared[row].cost for row in rows]
                )

            image_rows = [row for row, item in enumerate(job.items) if item.images]
            text_rows = [row for row, item in enumerate(job.items) if not item.images]
            text_results, image_results = await _all_or_none(run(text_rows, "text"), run(image_rows, "image"))
            by_row = dict(zip([*text_rows, *image_rows], [*text_results, *image_results], strict=True))
            results = [by_row[row] for row in range(len(job.items))]
            extractions = await self._postprocess(
                lambda: [
                    extractor.finish(item, ready.value, result.output, query)
                    for item, ready, result in zip(inputs, prepared, results, strict=True)
                ],
                clock,
                len(job.items),
            )
            self._count(model, len(job.items))
        return ExtractOutcome(model=job.model, results=extractions, timing=clock.timing(results))

    async def _prepare_extract(
        self, clock: _Clock, extractor: ItemExtractor, items: Sequence[ItemInput], query: ExtractQuery
    ) -> tuple[list[ExtractInput], list[Prepared]]:
        """Each item as the extractor reads it and prepared for the device: texts together on the CPU pool, each
        image decoded (within the image limits) and processed on the image pool. The first bad item in item order
        is the one reported."""
        started = time.perf_counter()

        def prepare(item: ItemInput) -> tuple[ExtractInput, Prepared] | SieError:
            """The item read and prepared, or the error that names it."""
            image = None
            try:
                if item.images:
                    assert isinstance(extractor, ImageExtractor)  # check_adapter_serves: a model taking images has one
                    image = decode_image(item, 0, limits=self.limits, resized_pixels=extractor.resized_pixels)
                read = ExtractInput(item.text, image)
                return read, extractor.prepare(read, query)
            except SieError as error:
                return error
            except ValueError as error:
                return InvalidArgument(f"{item.label}: {error}", reason="INVALID_ITEM", metadata=item.metadata)

        text_rows = [row for row, item in enumerate(items) if not item.images]
        image_rows = [row for row, item in enumerate(items) if item.images]
        loop = asyncio.get_running_loop()
        if image_rows:
            assert isinstance(extractor, ImageExtractor)  # check_adapter_serves: a model taking images has one
            check = functools.partial(check_images_pixels, limits=self.limits, resized_pixels=extractor.resized_pixels)
            await loop.run_in_executor(self._image_pool, check, items)
        texts = self.off_loop(
            lambda: [prepare(items[row]) for row in text_rows],
            len(text_rows),
            sum(len(items[row].text or "") for row in text_rows),
        )
        images = [loop.run_in_executor(self._image_pool, prepare, items[row]) for row in image_rows]
        text_outcomes, *image_outcomes = await asyncio.gather(texts, *images)
        clock.tokenization_ms += _ms_since(started)
        by_row = dict(zip([*text_rows, *image_rows], [*text_outcomes, *image_outcomes], strict=True))
        outcomes = [by_row[row] for row in range(len(items))]
        for outcome in outcomes:
            if isinstance(outcome, SieError):
                raise outcome
        pairs = cast(list[tuple[ExtractInput, Prepared]], outcomes)
        return [read for read, _ in pairs], [ready for _, ready in pairs]

    # -- shared stages --------------------------------------------------------

    async def _tokenize(
        self, clock: _Clock, tokenize: Callable[[], list[TokenizedText]], items: int, chars: int
    ) -> list[TokenizedText]:
        started = time.perf_counter()
        with span("tokenization"):
            tokenized = await self.off_loop(tokenize, items, chars)
        clock.tokenization_ms += _ms_since(started)
        return tokenized

    async def off_loop(self, work: Callable[[], T], items: int, chars: int = 0) -> T:
        """Run CPU work for `items` items: on the preprocessing threads, so that the event loop serves other
        requests meanwhile, unless they are few. For a few, the hop to a thread and back costs more than the
        work, and beside a bulk neighbour each hop waits for the GIL. `chars`: the text the work reads, if any."""
        if items <= INLINE_ITEMS and chars <= INLINE_TEXT_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._cpu_pool, work)

    async def _postprocess(self, finish: Callable[[], Any], clock: _Clock, items: int) -> Any:
        started = time.perf_counter()
        with span("postprocessing"):
            result = await self.off_loop(finish, items)
        clock.postprocessing_ms += _ms_since(started)
        return result

    def _work(self, model: LoadedModel, lora: str, forward: Forward) -> _DeviceWork:
        """`forward` on `model` with `lora`, under the model's batch policy."""
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = batching_for(self.settings, model.config.profile(model.profile))
        return _DeviceWork(model, policy, lora, forward)

    @staticmethod
    def _count(model: LoadedModel, items: int) -> None:
        model.stats.requests += 1
        model.stats.items += items

    async def _run_on_device(
        self, work: _DeviceWork, key: BatchKey, payloads: Sequence[Any], costs: Sequence[int]
    ) -> list[_ItemResult]:
        loop = asyncio.get_running_loop()
        pending = [
            PendingItem(key, cost, (work, payload), loop.create_future())
            for payload, cost in zip(payloads, costs, strict=True)
        ]
        self._former.add(pending, work.policy)
        QUEUE_DEPTH.set(self._former.pending)
        try:
            results = list(await asyncio.gather(*(item.future for item in pending)))
        except BaseException:
            for item in pending:
                item.future.cancel()
            self._former.discard(pending)
            QUEUE_DEPTH.set(self._former.pending)  # else it stays at what was queued until the next batch forms
            raise
        if recording():
            _record_device_spans(pending, results)
        return results

    async def _run_device(self) -> None:
        """Form batches and hand them to the device thread, at most PIPELINE_DEPTH at a time."""
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(PIPELINE_DEPTH)
        behind: _Handed | None = None
        while True:
            if (
                behind is not None
                and slots.locked()
                and not behind.running.done()
                and self._former.may_displace(behind.batch)
            ):
                batch = await self._instead_of(behind, slots)
            else:
                await slots.acquire()
                batch = await self._former.next_batch()
            QUEUE_DEPTH.set(self._former.pending)
            work: _DeviceWork = batch[0].payload[0]
            self._batches += 1
            running = self._device_thread.submit(_forward, work, batch)
            deliver = functools.partial(self._deliver, work, batch, self._batches, slots)
            running.add_done_callback(functools.partial(_deliver_unless_cancelled, loop, deliver))
            behind = _Handed(work, batch, running)

    async def _instead_of(self, behind: _Handed, slots: asyncio.Semaphore) -> Batch:
        """The next batch to hand over while `behind` waits for the device behind the running batch, with a slot
        held for it: a batch led by a request that came after `behind` was formed takes its place if it has not
        started (its items go back to the former), so a new request waits for one batch of a bulk neighbour, not
        two; else, once a slot frees, the next batch as usual."""
        slot = asyncio.ensure_future(slots.acquire())
        newer = asyncio.ensure_future(self._former.next_batch(newer_than=behind.batch.flows))
        try:
            await asyncio.wait({slot, newer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (slot, newer):
                if not task.done():
                    task.cancel()
        if newer.done() and not newer.cancelled():
            if behind.running.cancel():
                self._former.give_back(behind.batch, behind.work.policy)
                if slot.done() and not slot.cancelled():
                    slots.release()  # the batch given back holds a slot already, now this one's
            elif not (slot.done() and not slot.cancelled()):
                await slots.acquire()
            return newer.result()
        return await self._former.next_batch()

    def _deliver(
        self, work: _DeviceWork, batch: Batch, batch_id: int, slots: asyncio.Semaphore, running: Future
    ) -> None:
        """Fan a finished forward pass out to its items; should that fail, its items fail INTERNAL rather than wait
        for ever (a callback's exception reaches no caller)."""
        try:
            self._fan_out(work, batch, batch_id, slots, running)
        except Exception as error:
            log.exception("answering a forward pass of %d items on %s failed", len(batch), work.model.config.id)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(
                        Internal(f"answering the forward pass failed: {error}", reason="INFERENCE_FAILED")
                    )

    def _fan_out(
        self, work: _DeviceWork, batch: Batch, batch_id: int, slots: asyncio.Semaphore, running: Future
    ) -> None:
        """Fan a finished forward pass out to its items, and tell the model's batch policy how it went."""
        slots.release()
        model = work.model
        if running.cancelled():
            for item in batch:
                item.future.cancel()
            return
        error = running.exception()
        if error is not None:
            log.error("forward pass of %d items on %s failed", len(batch), model.config.id, exc_info=error)
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(_answer_for(error, model, len(batch)))
            return
        outputs, started, finished = running.result()
        model.stats.forward_passes += 1
        record_batch(model.config.id, model.profile, len(batch), batch.tokens, finished - started)
        stats = describe(batch_id, batch, work.policy, started, finished)
        work.policy.observe(batch, started, finished)
        publish_setting(model.config.id, model.profile, work.policy)
        if self.settings.instrumentation:
            record(model.config.id, model.profile, stats)
        paused: list[PendingItem] = []
        for row, item in enumerate(batch):
            if item.future.done():
                continue
            if isinstance(outputs[row], BaseException):  # the forward pass failed on this item alone
                item.future.set_exception(_answer_for(outputs[row], model, len(batch)))
            else:
                # what earlier slices of a generation took: (their batches, their waits)
                earlier, waited_ms = item.payload[2] if len(item.payload) > 2 else ((), 0.0)
                waited_ms += (started - item.enqueued_at) * 1000
                if isinstance(outputs[row], Continued):
                    item.payload = (work, outputs[row], ((*earlier, stats), waited_ms))
                    paused.append(item)
                else:
                    item.future.set_result(_ItemResult(outputs[row], stats, waited_ms, item.cost, earlier))
        if paused:
            self._continue(paused, batch_id)

    def _continue(self, paused: list[PendingItem], batch_id: int) -> None:
        """Queue again, as one flow of a group of their own, the items whose generation paused after a slice: their
        tags start at the current virtual time, so the batches of requests that came meanwhile run first, then the
        slice after (the group is ready at once and takes all of them)."""
        for item in paused:
            item.key = ("continued", batch_id)
        costs = [item.cost for item in paused]
        self._former.add(paused, BatchLimits(len(paused), len(paused) * max(costs), max_wait_s=0.0))
        QUEUE_DEPTH.set(self._former.pending)


@dataclass(frozen=True)
class _Handed:
    """A batch handed to the device thread, and its pass there (cancellable until it starts)."""

    work: _DeviceWork
    batch: Batch
    running: Future


def _deliver_unless_cancelled(loop: asyncio.AbstractEventLoop, deliver: Callable[[Future], None], done: Future) -> None:
    """A finished forward pass goes back to the event loop (from the device thread) unless it was cancelled."""
    if not done.cancelled():
        loop.call_soon_threadsafe(deliver, done)


def _forward(work: _DeviceWork, batch: Batch) -> tuple[Sequence[Any], float, float]:
    """Run one batch on the device thread: its outputs (or, for an item the pass failed on, the error) and when the
    pass started and finished (time.monotonic)."""
    started = time.monotonic()
    outputs = run_isolating_failures(
        lambda items: work.model.loras.run(work.lora, work.forward, items),
        [item.payload[1] for item in batch],
        is_oom=is_cuda_oom,
        recover=release_cuda_cache,
    )
    return outputs, started, time.monotonic()


def _answer_for(error: BaseException, model: LoadedModel, items: int) -> SieError:
    """What a caller is told when a forward pass of `items` items failed on every one: a SieError as it is; a lone
    item on a model that has completed passes is to blame itself (ITEM_FAILED, as when other items of its batch
    succeed: whether it shared a batch must not change its answer); anything else INTERNAL."""
    if items == 1 and model.stats.forward_passes > 0:
        return blame_item(error, because="the model answers other items")
    if isinstance(error, SieError):
        return error
    return Internal(f"inference failed on {model.config.id}: {error}", reason="INFERENCE_FAILED")


def _record_device_spans(pending: Sequence[PendingItem], results: Sequence[_ItemResult]) -> None:
    """A request's `queue` span (until its last item reached the device) and one `inference` span per
    forward pass that ran its items. A forward pass serves many requests: each request's trace gets its
    own span for it, with the batch id as attribute, rather than a span shared across traces."""
    batches: dict[int, tuple[float, float]] = {}
    for item, result in zip(pending, results, strict=True):
        batches[result.batch.batch_id] = (item.enqueued_at + result.queue_ms / 1000, result.batch.inference_ms / 1000)
    enqueued = min(item.enqueued_at for item in pending)
    record_span("queue", enqueued, max(start for start, _ in batches.values()), {"sie.items": len(pending)})
    for batch_id, (start, seconds) in sorted(batches.items()):
        items = sum(1 for result in results if result.batch.batch_id == batch_id)
        record_span("inference", start, start + seconds, {"sie.batch_id": batch_id, "sie.items": items})


def _finish(item: EncodedItem, plan: RequestPlan, *, is_query: bool) -> EncodedOutput:
    """One item's requested outputs after MUVERA, `dims` and the output dtype."""
    dense = None
    if "dense" in plan.outputs:
        if plan.muvera is None:
            normalized = cast(TextEncoder, plan.model.adapter).normalized  # the plan checked it encodes
            dense = truncate(item.vector("dense"), dims=plan.dims, normalized=normalized)
        else:
            multivector = item.vector("multivector")
            dense = truncate(muvera(multivector, plan.muvera, is_query=is_query), dims=plan.dims, normalized=False)
    return EncodedOutput(
        dense=None if dense is None else quantize(dense, plan.output_dtype),
        sparse=item.sparse if "sparse" in plan.outputs else None,
        multivector=quantize(item.vector("multivector"), plan.output_dtype) if "multivector" in plan.outputs else None,
    )


async def _all_or_none(*steps: Awaitable[Any]) -> list[Any]:
    """Run steps concurrently; when one fails, cancel the others (their queued items leave the BatchFormer) and
    raise."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        raise


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000
