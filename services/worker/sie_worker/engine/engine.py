"""The engine of one worker: every request, whatever its task, through the same stages, each its own module.

    admission (engine.admission) -> plan (engine.plan: the model, what is computed, the items in parts)
      -> prepare (engine.prepare: texts on the CPU pool, images on the image pool; the multivector bounds)
      -> device (engine.device: BatchFormer, the device thread) -> answer (engine.answer)

Items of concurrent requests share forward passes when their BatchKey (sie_worker.engine.batch_key) matches:
model, profile, LoRA and their part's query (operation, run-time options as canonical JSON, modality, outputs,
instruction, is_query, an extract's labels and threshold). Each caller gets its own items back in its own order.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from sie_common.edge.errors import FailedPrecondition
from sie_common.runtime.tracing import span
from sie_worker.engine.admission import Admission
from sie_worker.engine.answer import encoded, finished, ranked
from sie_worker.engine.device import DeviceLoop, DeviceThread, ItemResult
from sie_worker.engine.jobs import (
    EncodeJob,
    EncodeOutcome,
    ExtractJob,
    ExtractOutcome,
    ScoreJob,
    ScoreOutcome,
    Timing,
)
from sie_worker.engine.limits import Limits
from sie_worker.engine.plan import Planner, RequestPlan
from sie_worker.engine.prepare import Preparation, PreparedPart
from sie_worker.engine.timing import Clock, ms_since
from sie_worker.models.registry import ModelRegistry
from sie_worker.settings import WorkerSettings

log = logging.getLogger(__name__)

T = TypeVar("T")


class Engine:
    """The stages around a registry of models (passed in: an engine can be built in-process around any adapters)."""

    def __init__(self, settings: WorkerSettings, registry: ModelRegistry) -> None:
        self.settings = settings
        self.registry = registry
        self.device = registry.device
        self.limits = Limits.from_settings(settings)
        self._admission = Admission(settings.max_concurrent_requests)
        # One inference thread per device serializes device work (forward passes and LoRA loads).
        self._device_thread = DeviceThread()
        self._planner = Planner(registry, self.limits, settings.max_send_message_bytes, self._device_thread)
        self._preparation = Preparation(
            self.limits, settings.max_send_message_bytes, settings.preprocessor_workers, settings.image_workers
        )
        self._device = DeviceLoop(settings, self._device_thread, registry.device)
        self._background: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        await self._device.pin_threads()
        self._background = [
            asyncio.create_task(self._device.serve(), name="sie-device-loop"),
            asyncio.create_task(self.registry.monitor(), name="sie-memory-monitor"),
        ]
        for model_id in self.settings.preload_models:
            try:
                await self.registry.load(model_id)
            except Exception as error:  # noqa: BLE001 - reported in the log and ListModels; the other models still serve
                log.error("preloading %s failed: %s", model_id, error)

    async def drain(self, timeout_s: float) -> bool:
        """Refuse new requests (UNAVAILABLE) and wait for those in flight (`answering` ones included); False if the
        deadline passed first."""
        return await self._admission.drain(timeout_s)

    def answering(self) -> contextlib.AbstractContextManager[None]:
        """Hold a drain until the call is answered (Admission.answering)."""
        return self._admission.answering()

    async def stop(self) -> None:
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._preparation.stop()
        self._device_thread.shutdown(wait=True)
        self._device.unpin_threads()

    @property
    def in_flight(self) -> int:
        return self._admission.in_flight

    async def off_loop(self, work: Callable[[], T], items: int, chars: int = 0) -> T:
        """CPU work for `items` items off the event loop unless they are few (Preparation.off_loop)."""
        return await self._preparation.off_loop(work, items, chars)

    async def encode(self, job: EncodeJob) -> EncodeOutcome:
        outputs, results, timing = await self._serve(job, encoded)
        return EncodeOutcome(job.model, outputs, timing, tokens=sum(result.tokens for result in results))

    async def score(self, job: ScoreJob) -> ScoreOutcome:
        scored, results, timing = await self._serve(job, ranked)
        return ScoreOutcome(job.model, scored, timing, tokens=sum(result.tokens for result in results))

    async def extract(self, job: ExtractJob) -> ExtractOutcome:
        extractions, _, timing = await self._serve(job, lambda plan, items: items)
        return ExtractOutcome(job.model, extractions, timing)

    async def _serve(
        self, job: EncodeJob | ScoreJob | ExtractJob, answer: Callable[[RequestPlan, list[Any]], T]
    ) -> tuple[T, list[ItemResult], Timing]:
        """One request through every stage; `answer` makes its task's answer of the items' finished outputs. The
        answer, the items' device results and the request's timing."""
        clock = self._clock(job.debug)
        with self._admission.admitted(), contextlib.ExitStack() as holds:
            plan = self._planner.plan(job, holds)
            parts = await self._preparation.prepare(plan, clock)
            results = await self._run(plan, parts)
            started = time.perf_counter()
            with span("postprocessing"):
                made = await self.off_loop(lambda: answer(plan, finished(plan, parts, results)), len(plan.items))
            clock.postprocessing_ms += ms_since(started)
            plan.model.stats.requests += 1
            plan.model.stats.items += len(job.items)
        every = [result for part in results for result in part]
        return made, every, clock.timing(every)

    async def _run(self, plan: RequestPlan, parts: Sequence[PreparedPart]) -> list[list[ItemResult]]:
        """Every part through the device, together; when one fails, the others' queued items leave the former."""
        adapter = plan.model.adapter
        runs = []
        for part, prepared in zip(plan.parts, parts, strict=True):
            work = self._device.work(plan.model, plan.lora, functools.partial(adapter.run, query=part.query))
            values = [ready.value for ready in prepared.prepared]
            runs.append(self._device.run(work, part.key, values, [ready.cost for ready in prepared.prepared]))
        return await _all_or_none(*runs)

    def _clock(self, debug: bool) -> Clock:
        """A request's clock; `debug` (batch statistics in the answer) needs SIE_INSTRUMENTATION."""
        if debug and not self.settings.instrumentation:
            raise FailedPrecondition(
                f"debug: per-batch statistics are off on worker {self.settings.worker_id}; start it with "
                f"SIE_INSTRUMENTATION=true",
                reason="INSTRUMENTATION_OFF",
            )
        return Clock(time.perf_counter(), debug=debug)


async def _all_or_none(*steps: Awaitable[T]) -> list[T]:
    """Run steps concurrently; when one fails, cancel the others (their queued items leave the BatchFormer) and
    raise. A lone step is awaited in the caller's task: no task of its own, no turn of the event loop to join it."""
    if len(steps) == 1:
        return [await steps[0]]
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        raise
