"""The encode pipeline of one worker.

    admission -> tokenize (CPU pool) -> BatchFormer -> device thread -> postprocess (CPU pool)

Items of concurrent requests share forward passes when their batch key
(model, profile, operation, LoRA, output types) matches; each caller gets its
own items back in its own order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from sie_common.errors import Internal, InvalidArgument, ResourceExhausted
from sie_worker.batching import BatchFormer, PendingItem
from sie_worker.device import select_device
from sie_worker.postprocess import finish_dense
from sie_worker.registry import LoadedModel, ModelRegistry, read_model_configs
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodeJob:
    """A validated encode request."""

    model: str
    texts: list[str]
    output_types: tuple[str, ...] = ("dense",)
    output_dtype: str = "float32"
    instruction: str | None = None
    is_query: bool = False
    dims: int | None = None
    profile: str = ""
    lora: str = ""


@dataclass(frozen=True)
class Timing:
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    postprocessing_ms: float
    total_ms: float


@dataclass(frozen=True)
class EncodeOutcome:
    model: str
    dense: np.ndarray  # [items, dims] in the requested dtype
    timing: Timing


@dataclass(frozen=True)
class _ItemResult:
    vector: np.ndarray
    batch_id: int
    queue_ms: float
    inference_ms: float


class Engine:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.device = select_device(settings.device)
        self.registry = ModelRegistry(read_model_configs(settings), settings, self.device)
        self._former = BatchFormer()
        self._cpu_pool = ThreadPoolExecutor(settings.preprocessor_workers, thread_name_prefix="sie-cpu")
        # One inference thread per device serializes device work.
        self._device_thread = ThreadPoolExecutor(1, thread_name_prefix="sie-device")
        self._device_loop: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._batches = 0

    async def start(self) -> None:
        self._device_loop = asyncio.create_task(self._run_device(), name="sie-device-loop")
        for model_id in self.settings.preload_models:
            await self.registry.get(model_id)

    async def stop(self) -> None:
        if self._device_loop is not None:
            self._device_loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._device_loop
        self._cpu_pool.shutdown(wait=False, cancel_futures=True)
        self._device_thread.shutdown(wait=True)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @contextlib.contextmanager
    def admitted(self) -> Iterator[None]:
        """Hold one of SIE_MAX_CONCURRENT_REQUESTS slots, or answer RESOURCE_EXHAUSTED."""
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

    async def encode(self, job: EncodeJob) -> EncodeOutcome:
        started = time.perf_counter()
        with self.admitted():
            config = self.registry.config(job.model)
            _check_against_config(job, config.output_types)
            model = await self.registry.get(job.model, job.profile)
            if job.dims is not None and job.dims > model.encoder.dims:
                raise InvalidArgument(
                    f"dims {job.dims} exceeds the {model.encoder.dims} dimensions of {job.model}",
                    reason="DIMS_TOO_LARGE",
                    metadata={"dims": str(job.dims)},
                )
            loop = asyncio.get_running_loop()
            prompt = model.encoder.prompt(is_query=job.is_query, instruction=job.instruction)
            tokenize_start = time.perf_counter()
            tokenized = await loop.run_in_executor(self._cpu_pool, model.encoder.tokenize, job.texts, prompt)
            tokenization_ms = _ms_since(tokenize_start)

            results = await self._run_on_device(model, tokenized, key=(job.model, model.profile, "encode", job.lora, job.output_types))

            post_start = time.perf_counter()
            vectors = np.stack([result.vector for result in results])
            dense = await loop.run_in_executor(
                self._cpu_pool,
                lambda: finish_dense(vectors, dims=job.dims, normalized=model.encoder.normalized, dtype=job.output_dtype),
            )
            postprocessing_ms = _ms_since(post_start)
            model.stats.requests += 1
            model.stats.items += len(job.texts)
        batches = {result.batch_id: result.inference_ms for result in results}
        return EncodeOutcome(
            model=job.model,
            dense=dense,
            timing=Timing(
                queue_ms=max(result.queue_ms for result in results),
                tokenization_ms=tokenization_ms,
                inference_ms=sum(batches.values()),
                postprocessing_ms=postprocessing_ms,
                total_ms=_ms_since(started),
            ),
        )

    async def _run_on_device(self, model: LoadedModel, payloads: list, key: tuple) -> list[_ItemResult]:
        loop = asyncio.get_running_loop()
        pending = [PendingItem(key, len(payload.ids), (model, payload), loop.create_future()) for payload in payloads]
        self._former.add(pending, model.limits)
        try:
            return list(await asyncio.gather(*(item.future for item in pending)))
        except BaseException:
            for item in pending:
                item.future.cancel()
            raise

    async def _run_device(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._former.next_batch()
            model: LoadedModel = batch[0].payload[0]
            self._batches += 1
            batch_id = self._batches
            started = time.monotonic()
            try:
                vectors = await loop.run_in_executor(
                    self._device_thread, model.encoder.embed, [item.payload[1] for item in batch]
                )
            except Exception as error:
                log.exception("forward pass of %d items on %s failed", len(batch), model.config.id)
                failure = Internal(f"inference failed on {model.config.id}: {error}", reason="INFERENCE_FAILED")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(failure)
                continue
            finished = time.monotonic()
            model.stats.forward_passes += 1
            inference_ms = (finished - started) * 1000
            for row, item in enumerate(batch):
                if not item.future.done():
                    queue_ms = (started - item.enqueued_at) * 1000
                    item.future.set_result(_ItemResult(vectors[row], batch_id, queue_ms, inference_ms))


def _check_against_config(job: EncodeJob, produced: tuple[str, ...]) -> None:
    for output in job.output_types:
        if output not in produced:
            raise InvalidArgument(
                f"model {job.model} does not produce {output!r} output; it produces: {', '.join(produced)}",
                reason="OUTPUT_NOT_SUPPORTED",
                metadata={"output_type": output},
            )
    if job.lora:
        raise InvalidArgument(
            f"lora: model {job.model} has no LoRA adapter {job.lora!r}",
            reason="LORA_NOT_FOUND",
            metadata={"lora": job.lora},
        )


def _ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000
