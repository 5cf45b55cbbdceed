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

from sie_common.errors import Internal, InvalidArgument, ResourceExhausted, SieError, Unavailable
from sie_worker.batching import BatchFormer, PendingItem
from sie_worker.device import select_device
from sie_worker.memory import is_cuda_oom, release_cuda_cache, run_splitting_on_oom
from sie_worker.model_catalog import read_catalog
from sie_worker.postprocess import finish_dense
from sie_worker.registry import LoadedModel, ModelRegistry
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
        self.registry = ModelRegistry(read_catalog(settings), settings, self.device)
        self._former = BatchFormer()
        self._cpu_pool = ThreadPoolExecutor(settings.preprocessor_workers, thread_name_prefix="sie-cpu")
        # One inference thread per device serializes device work.
        self._device_thread = ThreadPoolExecutor(1, thread_name_prefix="sie-device")
        self._background: list[asyncio.Task[None]] = []
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
            except Exception as error:  # reported in the log and ListModels; the other models still serve
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

    async def encode(self, job: EncodeJob) -> EncodeOutcome:
        started = time.perf_counter()
        with self.admitted(), contextlib.ExitStack() as holds:
            config = self.registry.config(job.model)
            _check_against_config(job, config.output_types)
            model = holds.enter_context(self.registry.use(job.model, job.profile))
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
                    self._device_thread,
                    lambda: run_splitting_on_oom(
                        model.encoder.embed, [item.payload[1] for item in batch], is_oom=is_cuda_oom, recover=release_cuda_cache
                    ),
                )
            except Exception as error:
                log.exception("forward pass of %d items on %s failed", len(batch), model.config.id)
                failure = error
                if not isinstance(error, SieError):
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
